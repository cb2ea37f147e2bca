package disk

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit"
)

// fakeSys builds a /sys/class/block the way the kernel lays it out (class entries are
// links into /sys/devices; a partition's directory sits inside its disk's).
func fakeSys(t *testing.T) string {
	sys := t.TempDir()
	dev := sys + "/devices/pci0000:00/virtio1/block"
	disk := func(name string, sectors string, parts ...string) {
		testkit.WriteFile(t, dev+"/"+name+"/size", sectors)
		testkit.WriteFile(t, dev+"/"+name+"/uevent", "DEVTYPE=disk\nDEVNAME="+name+"\n")
		testkit.WriteFile(t, dev+"/"+name+"/removable", "0")
		testkit.WriteFile(t, dev+"/"+name+"/ro", "0")
		os.MkdirAll(sys+"/class/block", 0o755)
		os.Symlink(dev+"/"+name, sys+"/class/block/"+name)
		for i, p := range parts {
			pn := name + string(rune('1'+i))
			testkit.WriteFile(t, dev+"/"+name+"/"+pn+"/partition", string(rune('1'+i)))
			testkit.WriteFile(t, dev+"/"+name+"/"+pn+"/size", "2048")
			testkit.WriteFile(t, dev+"/"+name+"/"+pn+"/uevent", "DEVTYPE=partition\nDEVNAME="+pn+"\nPARTNAME="+p+"\n")
			os.Symlink(dev+"/"+name+"/"+pn, sys+"/class/block/"+pn)
		}
	}
	disk("vda", "8388608", "EFI", "BIOS", "BOOT", "META")
	disk("vdb", "8388608")
	disk("loop0", "1024")
	return sys
}

func TestListBlockDevicesAndChooseDisk(t *testing.T) {
	devs := ListBlockDevices(fakeSys(t))
	var names []string
	for _, d := range devs {
		names = append(names, d.Name+"<"+d.Disk+":"+d.PartName+">")
	}
	if strings.Join(names, " ") != "loop0<:> vda<:> vda1<vda:EFI> vda2<vda:BIOS> vda3<vda:BOOT> vda4<vda:META> vdb<:>" {
		t.Fatalf("%v", names)
	}
	blankAll := func(string) bool { return true }
	cases := []struct {
		configured, param, want string
		devs                    []BlockDev
	}{
		{"/dev/sdz", "/dev/vdb", "/dev/sdz", devs},     // install.disk wins
		{"", "/dev/vdb", "/dev/vdb", devs},             // then kiln.disk=
		{"", "none", "", devs},                         // kiln.disk=none: diskless
		{"", "", "/dev/vda", devs},                     // the disk holding BOOT/META
		{"", "", "/dev/vdb", withoutDisk(devs, "vda")}, // the only blank disk
		{"", "", "", withoutDisk(devs, "vda", "vdb")},  // loop devices never count
	}
	for _, c := range cases {
		if got, why := ChooseDisk(c.devs, c.configured, c.param, blankAll); got != c.want {
			t.Errorf("ChooseDisk(%q, %q) = %q (%s), want %q", c.configured, c.param, got, why, c.want)
		}
	}
	two := append(withoutDisk(devs, "vda"), BlockDev{Name: "vdc", Path: "/dev/vdc", Sectors: 100})
	if got, why := ChooseDisk(two, "", "", blankAll); got != "" || !strings.Contains(why, "2 blank disks") {
		t.Fatalf("two blank disks: %q %s", got, why)
	}
}

func withoutDisk(devs []BlockDev, names ...string) []BlockDev {
	var out []BlockDev
outer:
	for _, d := range devs {
		for _, n := range names {
			if d.Name == n || d.Disk == n {
				continue outer
			}
		}
		out = append(out, d)
	}
	return out
}

func TestProbeFilesystems(t *testing.T) {
	dir := t.TempDir()
	// an ISO 9660 primary volume descriptor, as genisoimage -V cidata writes it
	iso := make([]byte, 34*1024)
	copy(iso[32768:], "\x01CD001\x01")
	copy(iso[32768+40:], "cidata                          ")
	if fs, label, _ := probeFSBytes(iso); fs != "iso9660" || label != "cidata" {
		t.Fatalf("iso: %s %q", fs, label)
	}
	if fs, _, _ := probeFSBytes(make([]byte, 64*1024)); fs != "" {
		t.Fatalf("zeros: %s", fs)
	}
	blank := filepath.Join(dir, "blank.img")
	os.WriteFile(blank, make([]byte, 2<<20), 0o644)
	if !IsBlank(blank) {
		t.Fatal("zeros should be blank")
	}
	for _, tool := range []struct{ cmd, fs, label string }{
		{"mkfs.ext4 -q -F -L EPHEMERAL", "ext4", "EPHEMERAL"},
		{"mkfs.vfat -n CIDATA", "vfat", "CIDATA"},
		{"mkfs.vfat -F 32 -n KILNCFG", "vfat", "KILNCFG"},
		{"mkfs.xfs -q -f -L EPHEMERAL", "xfs", "EPHEMERAL"},
	} {
		args := strings.Fields(tool.cmd)
		bin, err := exec.LookPath(args[0])
		if err != nil {
			bin = "/usr/sbin/" + args[0]
			if _, err := os.Stat(bin); err != nil {
				t.Logf("%s not installed: skipped", args[0])
				continue
			}
		}
		img := filepath.Join(dir, tool.fs+tool.label+".img")
		os.WriteFile(img, nil, 0o644)
		os.Truncate(img, 300<<20)
		if out, err := supervisor.Run(bin, append(args[1:], img)...); err != nil {
			t.Fatalf("%s: %v\n%s", tool.cmd, err, out)
		}
		fs, label, err := ProbeFS(img)
		if err != nil || fs != tool.fs || label != tool.label {
			t.Errorf("%s: probed %q %q %v", tool.cmd, fs, label, err)
		}
		if IsBlank(img) {
			t.Errorf("%s: a formatted image is not blank", tool.cmd)
		}
	}
}
