package main

// `machined install` against the signatures machined's probe knows, on image files: each
// signature written where the real tool writes it (stubs, named so below, as in
// internal/disk's probe_test.go) and, where the tool is installed, made by the real tool;
// machined's probe alone must find each, and `machined install` must refuse each without
// --wipe and overwrite it with --wipe.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	// disk is these tests' name for the target, so the package goes by another here
	diskpkg "kiln/machined/internal/disk"
	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit"
)

func installWant(name, want string) string {
	if name == "MBR signature only" && diskpkg.LookTool("wipefs") != "" {
		return "an MBR partition table (dos)"
	}
	return want
}

// Stubbed signatures through `machined install`: refused naming the finding, then --wipe.
func TestInstallRefusesEachStubbedSignatureUnlessWipe(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 4<<20)
	for name, c := range testkit.SignatureStubs {
		disk := filepath.Join(dir, "used.img")
		testkit.StubDisk(t, disk, c.Patches)
		code, _, errs := runInstall(t, "--disk", disk, "--image", image)
		if code != 2 || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, "refusing to install onto "+disk+": it holds ") ||
			!strings.Contains(errs, installWant(name, c.Want)) || !strings.HasSuffix(errs, "; pass --wipe to overwrite it\n") {
			t.Errorf("%s: exit %d, stderr %q (want %q named)", name, code, errs, c.Want)
			continue
		}
		code, out, errs := runInstall(t, "--disk", disk, "--image", image, "--wipe")
		if code != 0 || !strings.Contains(out, "--wipe: overwriting ") || !strings.Contains(out, installWant(name, c.Want)) {
			t.Errorf("%s with --wipe: exit %d: %s%s", name, code, out, errs)
			continue
		}
		sameStart(t, image, disk)
	}
}

func TestInstallRefusesNonZeroEndsWithoutSignature(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 4<<20)
	for name, off := range map[string]int64{"first MiB": 300 << 10, "last MiB": testkit.ProbeDiskSize - 200<<10} {
		disk := filepath.Join(dir, "data.img")
		testkit.StubDisk(t, disk, map[int64][]byte{off: []byte("some data nobody recognises")})
		if found, err := diskpkg.ProbePath(disk); err != nil || len(found) != 0 {
			t.Fatalf("%s: machined's probe found %v in plain data (%v)", name, found, err)
		}
		refusedOneLine(t, "it holds data in its "+name+"; pass --wipe", "--disk", disk, "--image", image)
		if code, _, errs := runInstall(t, "--disk", disk, "--image", image, "--wipe"); code != 0 {
			t.Fatalf("%s with --wipe: exit %d: %s", name, code, errs)
		}
		sameStart(t, image, disk)
	}
}

func TestInstallAcceptsEmptyDiskAndSaysHowItChecked(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 4<<20)
	disk := emptyDisk(t, dir, testkit.ProbeDiskSize)
	code, out, errs := runInstall(t, "--disk", disk, "--image", image)
	if code != 0 || !strings.Contains(out, disk+" is empty (checked by machined's probe") {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	if diskpkg.LookTool("wipefs") != "" && !strings.Contains(out, "and wipefs;") {
		t.Fatalf("wipefs is installed but did not check: %s", out)
	}
}

// Real tools where installed: machined's probe alone finds what each wrote, and so does
// util-linux (wipefs) where installed; install refuses without --wipe.
func TestProbeFindsWhatRealToolsWrite(t *testing.T) {
	tools := []struct {
		tool string
		args []string
		id   string
	}{
		{"mkfs.ntfs", []string{"--fast", "--force", "--quiet"}, "ntfs"},
		{"mkfs.exfat", nil, "exfat"},
		{"mkfs.f2fs", []string{"-f", "-q"}, "f2fs"},
		{"mkfs.ext4", []string{"-q", "-F"}, "ext4"},
		{"mkfs.xfs", []string{"-q", "-f"}, "xfs"},
		{"mkfs.btrfs", []string{"-q", "-f"}, "btrfs"},
		{"mkfs.vfat", nil, "vfat"},
		{"mkswap", nil, "swap"},
	}
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 4<<20)
	ran := 0
	for _, c := range tools {
		path, err := exec.LookPath(c.tool)
		if err != nil {
			t.Logf("%s not installed: not tested with the real tool", c.tool)
			continue
		}
		ran++
		disk := filepath.Join(dir, c.id+".img")
		size := int64(testkit.ProbeDiskSize)
		if c.id == "xfs" || c.id == "btrfs" || c.id == "f2fs" {
			size = 320 << 20 // their smallest filesystems
		}
		_ = os.WriteFile(disk, nil, 0o644)
		_ = os.Truncate(disk, size)
		if out, err := supervisor.Run(path, append(c.args, disk)...); err != nil {
			t.Fatalf("%s: %v\n%s", c.tool, err, out)
		}
		found, err := diskpkg.ProbePath(disk)
		if err != nil {
			t.Fatal(err)
		}
		ok := false
		for _, f := range found {
			ok = ok || f.ID == c.id
		}
		if !ok {
			t.Errorf("%s: machined's probe found %v, want %s", c.tool, found, c.id)
		}
		code, _, errs := runInstall(t, "--disk", disk, "--image", image)
		if code != 2 || !strings.Contains(errs, "("+c.id+")") {
			t.Errorf("%s: exit %d: %s", c.tool, code, errs)
		}
		os.Remove(disk)
	}
	if ran == 0 {
		testkit.Unavailable(t, "none of the mkfs tools is installed")
	}
}

// The installer container holds no util-linux: machined's probe alone decides there.
func TestInstallWithoutUtilLinuxUsesMachinedProbeAlone(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 4<<20) // with sfdisk, before util-linux goes out of sight
	t.Setenv("PATH", t.TempDir())
	saved := diskpkg.ToolDirs
	diskpkg.ToolDirs = nil
	defer func() { diskpkg.ToolDirs = saved }()
	disk := emptyDisk(t, dir, testkit.ProbeDiskSize)
	code, out, errs := runInstall(t, "--disk", disk, "--image", image)
	if code != 0 || !strings.Contains(out, disk+" is empty (checked by machined's probe;") {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	testkit.StubDisk(t, disk, testkit.SignatureStubs["mdraid 1.2"].Patches)
	refusedOneLine(t, "it holds an mdraid array member (metadata 1.x) (linux_raid_member); pass --wipe", "--disk", disk, "--image", image)
}
