package disk

// machined's probe on image files: each signature written where the real tool writes it
// (stubs, named so below) and, where the tool is installed, made by the real tool; machined's
// probe alone must find each. The in-use checks read fake /sys and /proc trees (this
// project's VMs have neither device-mapper nor md in their kernel). That `machined install`
// refuses each without --wipe and overwrites it with --wipe is tested in main's
// install_probe_test.go.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit"
)

func probeFile(t *testing.T, path string) []Finding {
	t.Helper()
	found, err := ProbePath(path)
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func hasFinding(found []Finding, want string) bool {
	for _, f := range found {
		if f.String() == want {
			return true
		}
	}
	return false
}

// Stubbed signatures: the bytes written where the real tool writes them (see testkit.SignatureStubs).
func TestProbeFindsEachStubbedSignature(t *testing.T) {
	dir := t.TempDir()
	for name, c := range testkit.SignatureStubs {
		path := filepath.Join(dir, "disk.img")
		testkit.StubDisk(t, path, c.Patches)
		if found := probeFile(t, path); !hasFinding(found, c.Want) {
			t.Errorf("%s: machined's probe found %v, want %q", name, found, c.Want)
		}
	}
}

func TestProbeDoesNotMistakeAnImageForForeignData(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 4<<20)
	found := probeFile(t, image)
	if JoinFindings(found) != "a protective MBR (PMBR), a GPT partition table (gpt) and a backup GPT header (gpt)" {
		t.Fatalf("found %v", found)
	}
	if got := JoinFindings(mergeFindings(found)); got != "a GPT partition table (gpt)" {
		t.Fatalf("merged: %q", got)
	}
}

func TestParseUtilLinuxOutput(t *testing.T) {
	wipefs := `{"signatures": [
	  {"device":"loop0","offset":"0x218","type":"LVM2_member","uuid":"x","label":null},
	  {"device":"loop0","offset":"0x3fffe00","type":"gpt","uuid":null,"label":null},
	  {"device":"loop0","offset":"0x1fe","type":"PMBR","uuid":null,"label":null},
	  {"device":"loop0","offset":"0x0","type":"zonefs","uuid":null,"label":null}]}`
	found, err := parseWipefsJSON([]byte(wipefs))
	if err != nil {
		t.Fatal(err)
	}
	got := JoinFindings(mergeFindings(found))
	want := "an LVM2 physical volume (LVM2_member), a backup GPT header (gpt), a protective MBR (PMBR) and a zonefs signature (zonefs)"
	if got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	// the same signature from both probes is named once, in machined's words
	own := []Finding{{"an mdraid array member (metadata 1.x)", "linux_raid_member", 4096}}
	ul, _ := parseWipefsJSON([]byte(`{"signatures": [{"offset":"0x1000","type":"linux_raid_member"}]}`))
	if got := JoinFindings(mergeFindings(own, ul)); got != "an mdraid array member (metadata 1.x) (linux_raid_member)" {
		t.Fatalf("merged: %q", got)
	}
	if found, err := parseWipefsJSON([]byte(`{"signatures": []}`)); err != nil || len(found) != 0 {
		t.Fatalf("empty: %v %v", found, err)
	}
	if _, err := parseWipefsJSON([]byte(`{"signatures": [`)); err == nil {
		t.Fatal("truncated JSON accepted")
	}
	found = parseBlkidExport([]byte("DEVNAME=/dev/loop0\nPTUUID=9a\nPTTYPE=gpt\n"))
	if JoinFindings(found) != "a GPT partition table (gpt)" {
		t.Fatalf("blkid: %v", found)
	}
	found = parseBlkidExport([]byte("DEVNAME=/dev/loop0\nUUID=x\nTYPE=linux_raid_member\n"))
	if JoinFindings(found) != "an mdraid array member (linux_raid_member)" {
		t.Fatalf("blkid: %v", found)
	}
}

// fakeSysForUsers makes a /sys/dev/block tree for disk 7:3 with partition loop3p1 (259:0).
func fakeSysForUsers(t *testing.T) (sysRoot, procRoot string) {
	t.Helper()
	root := t.TempDir()
	sysRoot, procRoot = filepath.Join(root, "sys"), filepath.Join(root, "proc")
	disk := filepath.Join(sysRoot, "dev", "block", "7:3")
	write := func(path, data string) {
		_ = os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(disk, "dev"), "7:3\n")
	_ = os.MkdirAll(filepath.Join(disk, "holders"), 0o755)
	write(filepath.Join(disk, "loop3p1", "dev"), "259:0\n")
	write(filepath.Join(disk, "loop3p1", "partition"), "1\n")
	_ = os.MkdirAll(filepath.Join(disk, "loop3p1", "holders"), 0o755)
	write(filepath.Join(procRoot, "self", "mountinfo"), "22 1 0:21 / /proc rw - proc proc rw\n")
	write(filepath.Join(procRoot, "swaps"), "Filename\tType\tSize\tUsed\tPriority\n")
	return sysRoot, procRoot
}

func TestDiskUsersFromFakeSysAndProc(t *testing.T) {
	rdev := uint64(7<<8 | 3)
	sysRoot, procRoot := fakeSysForUsers(t)
	if users := Users(sysRoot, procRoot, "/dev/loop3", rdev); len(users) != 0 {
		t.Fatalf("idle disk: %v", users)
	}
	mountinfo := filepath.Join(procRoot, "self", "mountinfo")
	_ = os.WriteFile(mountinfo, []byte("22 1 0:21 / /proc rw - proc proc rw\n"+
		`40 1 259:0 / /mnt/my\040data rw,relatime - ext4 /dev/loop3p1 rw`+"\n"), 0o644)
	users := Users(sysRoot, procRoot, "/dev/loop3", rdev)
	if strings.Join(users, ", ") != "/dev/loop3p1 is mounted at /mnt/my data" {
		t.Fatalf("mounted partition: %v", users)
	}
	_ = os.WriteFile(mountinfo, nil, 0o644)

	// held by device-mapper (on the disk) and md (on the partition)
	_ = os.MkdirAll(filepath.Join(sysRoot, "dev/block/7:3/holders/dm-0"), 0o755)
	_ = os.MkdirAll(filepath.Join(sysRoot, "class/block/dm-0/dm"), 0o755)
	_ = os.WriteFile(filepath.Join(sysRoot, "class/block/dm-0/dm/name"), []byte("vg-root\n"), 0o644)
	_ = os.MkdirAll(filepath.Join(sysRoot, "dev/block/7:3/loop3p1/holders/md127"), 0o755)
	users = Users(sysRoot, procRoot, "/dev/loop3", rdev)
	want := "/dev/loop3 is held by dm-0 (device-mapper vg-root), /dev/loop3p1 is held by md127 (md array)"
	if strings.Join(users, ", ") != want {
		t.Fatalf("held:\n got %v\nwant %s", users, want)
	}
}

// A real block device in /proc/swaps is found by its device number, whatever its path.
func TestDiskUsersSwapByDeviceNumber(t *testing.T) {
	var dev string
	for _, p := range []string{"/dev/loop0", "/dev/zram0", "/dev/null"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0 {
			dev = p
			break
		}
	}
	if dev == "" {
		t.Skip("no block device node to name in a fake /proc/swaps")
	}
	fi, _ := os.Stat(dev)
	rdev := statRdev(fi)
	sysRoot, procRoot := fakeSysForUsers(t)
	_ = os.WriteFile(filepath.Join(procRoot, "swaps"), []byte("Filename\tType\tSize\tUsed\tPriority\n"+dev+"\tpartition\t1024\t0\t-2\n"), 0o644)
	if users := Users(sysRoot, procRoot, "/dev/disk-x", rdev); strings.Join(users, ", ") != "/dev/disk-x is in use as swap" {
		t.Fatalf("swap: %v", users)
	}
}

func TestDevKey(t *testing.T) {
	for rdev, want := range map[uint64]string{7<<8 | 3: "7:3", 259 << 8: "259:0", 8<<8 | 44 | 256<<12: "8:300"} {
		if got := devKey(rdev); got != want {
			t.Errorf("devKey(%#x) = %s, want %s", rdev, got, want)
		}
	}
}

func statRdev(fi os.FileInfo) uint64 { return uint64(fi.Sys().(*syscall.Stat_t).Rdev) }

// Where blkid is the only util-linux tool (a Kiln rootfs): its answers, including
// "ambivalent" for several signatures, are read.
func TestProbeWithBlkidAlone(t *testing.T) {
	blkid := LookTool("blkid")
	mkfs, err := exec.LookPath("mkfs.ext4")
	if blkid == "" || err != nil {
		testkit.Unavailable(t, "needs blkid and mkfs.ext4")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	_ = os.Mkdir(bin, 0o755)
	if err := os.Symlink(blkid, filepath.Join(bin, "blkid")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	saved := ToolDirs
	ToolDirs = nil
	defer func() { ToolDirs = saved }()

	disk := filepath.Join(dir, "d.img")
	testkit.StubDisk(t, disk, nil)
	if found, tool, err := probeWithUtilLinux(disk); tool != "blkid" || err != nil || len(found) != 0 {
		t.Fatalf("empty: %v %q %v", found, tool, err)
	}
	if out, err := supervisor.Run(mkfs, "-q", "-F", disk); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	if found, _, err := probeWithUtilLinux(disk); err != nil || JoinFindings(found) != "an ext4 filesystem (ext4)" {
		t.Fatalf("ext4: %v %v", found, err)
	}
	// real swap plus btrfs magic: blkid will not choose between them
	mkswap, err := exec.LookPath("mkswap")
	if err != nil {
		return
	}
	testkit.StubDisk(t, disk, nil)
	if out, err := supervisor.Run(mkswap, disk); err != nil {
		t.Fatalf("mkswap: %v %s", err, out)
	}
	f, _ := os.OpenFile(disk, os.O_RDWR, 0)
	_, _ = f.WriteAt([]byte("_BHRfS_M"), 65600)
	f.Close()
	found, _, err := probeWithUtilLinux(disk)
	if err != nil || JoinFindings(found) != "several signatures (blkid: ambivalent result)" {
		t.Fatalf("swap + btrfs: %v %v", found, err)
	}
}

// machined claims a disk without a partition table on the first boot only when it is blank:
// zeros at both ends, so an md 1.0 member (superblock at the end) is not taken.
func TestIsBlankLooksAtBothEnds(t *testing.T) {
	dir := t.TempDir()
	disk := filepath.Join(dir, "d.img")
	testkit.StubDisk(t, disk, nil)
	if !IsBlank(disk) {
		t.Fatal("zeros are blank")
	}
	testkit.StubDisk(t, disk, testkit.SignatureStubs["mdraid 1.0"].Patches)
	if IsBlank(disk) {
		t.Fatal("an md 1.0 member is not blank")
	}
	testkit.StubDisk(t, disk, map[int64][]byte{-100: {1}})
	if IsBlank(disk) {
		t.Fatal("data in the last MiB is not blank")
	}
}
