package disk

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit"
)

const gib = 1 << 30

func TestPlanBlankDisk(t *testing.T) {
	plan, err := planPartitions(DiskLayout{SectorSize: 512, Sectors: 4 * gib / 512})
	if err != nil {
		t.Fatal(err)
	}
	// a new GPT: usable from 1 MiB to before the 33-sector backup; EPHEMERAL is MiB-sized
	want := []NewPartition{
		{Name: "STATE", Start: 2048, Size: 204800},
		{Name: "EPHEMERAL", Start: 206848, Size: (4*gib/512 - 34 - 206848) / 2048 * 2048},
	}
	if !reflect.DeepEqual(plan, want) {
		t.Fatalf("got %+v\nwant %+v", plan, want)
	}
}

// The disk image layout the imager writes: EFI, BIOS boot, BOOT, META, then free space.
func imageLayout(sectors uint64) DiskLayout {
	return DiskLayout{SectorSize: 512, Sectors: sectors, HasTable: true, FirstLBA: 34, LastLBA: sectors - 34,
		Partitions: []Partition{
			{Start: 2048, Size: 204800, Name: "EFI"},
			{Start: 206848, Size: 2048, Name: "BIOS"},
			{Start: 208896, Size: 2048000, Name: "BOOT"},
			{Start: 2256896, Size: 2048, Name: "META"},
		}}
}

func TestPlanAfterTheImagePartitions(t *testing.T) {
	d := imageLayout(20 * gib / 512)
	plan, err := planPartitions(d)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != 2 || plan[0].Name != "STATE" || plan[0].Start != 2258944 || plan[0].Size != 204800 {
		t.Fatalf("STATE: %+v", plan)
	}
	eph := plan[1]
	if eph.Name != "EPHEMERAL" || eph.Start != 2258944+204800 || eph.Start+eph.Size > d.LastLBA+1 || eph.Size%2048 != 0 {
		t.Fatalf("EPHEMERAL: %+v", eph)
	}
	if d.LastLBA+1-(eph.Start+eph.Size) >= 2048 {
		t.Fatalf("EPHEMERAL leaves a MiB or more unused: %+v", eph)
	}
}

func TestPlanOnlyWhatIsMissing(t *testing.T) {
	d := imageLayout(8 * gib / 512)
	plan, _ := planPartitions(d)
	d.Partitions = append(d.Partitions, Partition{Start: plan[0].Start, Size: plan[0].Size, Name: "STATE"})
	again, err := planPartitions(d)
	if err != nil || len(again) != 1 || again[0].Name != "EPHEMERAL" || again[0] != plan[1] {
		t.Fatalf("with STATE present: %+v %v", again, err)
	}
	d.Partitions = append(d.Partitions, Partition{Start: plan[1].Start, Size: plan[1].Size, Name: "EPHEMERAL"})
	if done, err := planPartitions(d); err != nil || done != nil {
		t.Fatalf("with both present: %+v %v", done, err)
	}
}

func TestPlanPicksTheLargestGap(t *testing.T) {
	// 2 GiB disk; a small hole at the start, a partition in the middle, a big hole after it
	d := DiskLayout{SectorSize: 512, Sectors: 2 * gib / 512, HasTable: true, FirstLBA: 34, LastLBA: 2*gib/512 - 34,
		Partitions: []Partition{{Start: 400 * 2048, Size: 100 * 2048, Name: "BOOT"}}}
	plan, err := planPartitions(d)
	if err != nil {
		t.Fatal(err)
	}
	if plan[0].Start != 500*2048 {
		t.Fatalf("should use the gap after BOOT: %+v", plan)
	}
}

func TestPlanRefusesWhenFull(t *testing.T) {
	d := imageLayout(2400000) // barely more than the image itself
	if _, err := planPartitions(d); err == nil || !strings.Contains(err.Error(), "need 356 MiB free for STATE and EPHEMERAL") {
		t.Fatalf("got %v", err)
	}
	if _, err := planPartitions(DiskLayout{SectorSize: 512}); err == nil {
		t.Fatal("an unknown size must be an error")
	}
}

func TestPlan4KSectors(t *testing.T) {
	plan, err := planPartitions(DiskLayout{SectorSize: 4096, Sectors: 4 * gib / 4096})
	if err != nil {
		t.Fatal(err)
	}
	if plan[0].Start != 256 || plan[0].Size != 25600 || plan[1].Start != 256+25600 || plan[1].Size%256 != 0 {
		t.Fatalf("4K: %+v", plan)
	}
}

func TestSfdiskScriptAndJSON(t *testing.T) {
	plan := []NewPartition{{Name: "STATE", Start: 2048, Size: 204800}}
	if got := sfdiskScript(DiskLayout{}, plan); got != "label: gpt\nstart=2048, size=204800, type="+linuxFSType+", name=STATE\n" {
		t.Fatalf("script: %q", got)
	}
	if got := sfdiskScript(DiskLayout{HasTable: true}, plan); strings.Contains(got, "label") {
		t.Fatalf("appending must not write a label: %q", got)
	}
	js := `{"partitiontable": {"label": "gpt", "id": "X", "device": "/dev/vda", "unit": "sectors",
	  "firstlba": 34, "lastlba": 8388574, "sectorsize": 512,
	  "partitions": [{"node": "/dev/vda1", "start": 2048, "size": 204800, "type": "C12A7328-F81F-11D2-BA4B-00A0C93EC93B", "uuid": "U", "name": "EFI"}]}}`
	layout, err := ParseSfdiskJSON([]byte(js))
	if err != nil || !layout.HasTable || layout.LastLBA != 8388574 || layout.Partitions[0].Name != "EFI" || layout.Partitions[0].Node != "/dev/vda1" {
		t.Fatalf("%+v %v", layout, err)
	}
	if _, err := ParseSfdiskJSON([]byte(`{"partitiontable": {"label": "dos"}}`)); err == nil || !strings.Contains(err.Error(), "only extends GPT") {
		t.Fatalf("MBR: %v", err)
	}
}

// The plan applied with the real sfdisk on an image file, as machined applies it to a disk.
func TestPlanAppliedWithSfdisk(t *testing.T) {
	sf, err := exec.LookPath("sfdisk")
	if err != nil {
		testkit.Unavailable(t, "sfdisk not installed (Debian: fdisk)")
	}
	for _, withImage := range []bool{false, true} {
		img := filepath.Join(t.TempDir(), "disk.img")
		if err := os.WriteFile(img, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, 2*gib); err != nil {
			t.Fatal(err)
		}
		if withImage {
			script := "label: gpt\nsize=100MiB, type=U, name=EFI\nsize=1MiB, type=21686148-6449-6E6F-744E-656564454649, name=BIOS\nsize=500MiB, name=BOOT\nsize=1MiB, name=META\n"
			if out, err := supervisor.RunInput([]byte(script), sf, "--quiet", img); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		}
		layout := DiskLayout{SectorSize: 512}
		if out, err := supervisor.Run(sf, "--json", img); err == nil {
			if layout, err = ParseSfdiskJSON([]byte(out)); err != nil {
				t.Fatal(err)
			}
		} else if withImage {
			t.Fatalf("sfdisk --json: %v", err)
		}
		layout.Sectors = 2 * gib / 512
		plan, err := planPartitions(layout)
		if err != nil {
			t.Fatal(err)
		}
		args := []string{"--quiet", "--wipe-partitions", "always"}
		if layout.HasTable {
			args = append(args, "--append")
		}
		if out, err := supervisor.RunInput([]byte(sfdiskScript(layout, plan)), sf, append(args, img)...); err != nil {
			t.Fatalf("apply: %v\n%s", err, out)
		}
		out, err := supervisor.Run(sf, "--json", img)
		if err != nil {
			t.Fatal(err)
		}
		after, _ := ParseSfdiskJSON([]byte(out))
		var names []string
		for _, p := range after.Partitions {
			names = append(names, p.Name)
		}
		want := "STATE,EPHEMERAL"
		if withImage {
			want = "EFI,BIOS,BOOT,META,STATE,EPHEMERAL"
		}
		if strings.Join(names, ",") != want {
			t.Fatalf("partitions after apply: %v", names)
		}
		last := after.Partitions[len(after.Partitions)-1]
		if last.Start != plan[1].Start || last.Size != plan[1].Size || last.Type != linuxFSType {
			t.Fatalf("EPHEMERAL on disk %+v, planned %+v", last, plan[1])
		}
		after.Sectors = layout.Sectors
		if again, err := planPartitions(after); err != nil || again != nil {
			t.Fatalf("second boot plans %+v %v", again, err)
		}
	}
}
