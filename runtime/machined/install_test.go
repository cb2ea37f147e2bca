package main

// `machined install` against real files: images made with the real sfdisk and mkfs.ext4,
// gzip written by compress/gzip, and (as root) a real loop device.

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	// disk is these tests' name for the target, so the package goes by another here
	diskpkg "kiln/machined/internal/disk"
	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit"
)

// emptyDisk makes a sparse all-zero file of the given size.
func emptyDisk(t *testing.T, dir string, size int64) string {
	t.Helper()
	path := filepath.Join(dir, "target.img")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	return path
}

func runInstall(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = installMain(args, &out, &errb)
	return code, out.String(), errb.String()
}

// sameStart checks that disk begins with image's bytes and is zero after them.
func sameStart(t *testing.T, image, disk string) {
	t.Helper()
	want, _ := os.ReadFile(image)
	got, _ := os.ReadFile(disk)
	if len(got) < len(want) {
		t.Fatalf("disk holds %d bytes, image %d", len(got), len(want))
	}
	if !bytes.Equal(got[:len(want)], want) {
		t.Fatal("the disk does not start with the image's bytes")
	}
	if i := bytes.IndexFunc(got[len(want):], func(r rune) bool { return r != 0 }); i >= 0 {
		t.Fatalf("non-zero byte %d bytes after the image's end", i)
	}
}

func TestInstallOntoEmptyFileKeepsSizeAndStaysSparse(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 8<<20)
	disk := emptyDisk(t, dir, 32<<20)
	code, out, errs := runInstall(t, "--disk", disk, "--image", image)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	sameStart(t, image, disk)
	st, _ := os.Stat(disk)
	if st.Size() != 32<<20 {
		t.Fatalf("disk size %d, want the target's 32 MiB kept", st.Size())
	}
	if blocks := st.Sys().(*syscall.Stat_t).Blocks * 512; blocks > 4<<20 {
		t.Fatalf("%d bytes allocated: zero blocks were written, not skipped", blocks)
	}
	for _, want := range []string{"install: writing", "install: 100% (8/8 MiB)", "install: synced", "install: done"} {
		if !strings.Contains(out, want) {
			t.Fatalf("progress lacks %q:\n%s", want, out)
		}
	}
	// and real sfdisk reads the installed table: the same partitions, names included
	sf, _ := exec.LookPath("sfdisk")
	dump := func(p string) string {
		b, err := supervisor.Run(sf, "--dump", p)
		if err != nil {
			t.Fatalf("sfdisk --dump %s: %v", p, err)
		}
		var lines []string
		for _, l := range strings.Split(b, "\n") {
			if strings.Contains(l, "name=") {
				lines = append(lines, l[strings.Index(l, ":"):])
			}
		}
		return strings.Join(lines, "\n")
	}
	if a, b := dump(image), dump(disk); a != b || !strings.Contains(a, `name="BOOT"`) {
		t.Fatalf("partitions differ:\nimage:%s\ndisk:%s", a, b)
	}
}

func gzipImage(t *testing.T, raw string, withSize bool) string {
	t.Helper()
	data, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	path := raw + ".gz"
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	if withSize {
		extra := []byte{'K', 'S', 8, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.LittleEndian.PutUint64(extra[4:], uint64(len(data)))
		zw.Header.Extra = extra
	}
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return path
}

func TestInstallGzipImage(t *testing.T) {
	for _, withSize := range []bool{true, false} {
		dir := t.TempDir()
		image := testkit.GPTImage(t, dir, 4<<20)
		gz := gzipImage(t, image, withSize)
		disk := emptyDisk(t, dir, 6<<20)
		code, out, errs := runInstall(t, "--disk", disk, "--image", gz)
		if code != 0 {
			t.Fatalf("size field %v: exit %d: %s", withSize, code, errs)
		}
		if !strings.Contains(out, "(gzip, 4 MiB)") {
			t.Fatalf("size field %v: progress: %s", withSize, out)
		}
		sameStart(t, image, disk)
	}
}

func TestInstallGzipWrongSizeFails(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 4<<20)
	data, _ := os.ReadFile(image)
	f, _ := os.Create(image + ".gz")
	zw := gzip.NewWriter(f)
	zw.Header.Extra = []byte{'K', 'S', 8, 0, 0, 0, 0x30, 0, 0, 0, 0, 0} // 3 MiB: shorter than the data
	_, _ = zw.Write(data)
	_ = zw.Close()
	f.Close()
	disk := emptyDisk(t, dir, 6<<20)
	code, _, errs := runInstall(t, "--disk", disk, "--image", image+".gz")
	if code != 1 || !strings.Contains(errs, "longer than its recorded size") {
		t.Fatalf("exit %d: %s", code, errs)
	}
}

// refusedOneLine checks a refusal: exit 2, one line on stderr containing want.
func refusedOneLine(t *testing.T, want string, args ...string) {
	t.Helper()
	code, out, errs := runInstall(t, args...)
	if code != 2 {
		t.Fatalf("exit %d, want 2; stdout %q stderr %q", code, out, errs)
	}
	if strings.Count(errs, "\n") != 1 || !strings.Contains(errs, want) {
		t.Fatalf("stderr %q, want one line containing %q", errs, want)
	}
}

func TestInstallRefusesDiskWithContentUnlessWipe(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 4<<20)
	cases := map[string]func(path string){
		"a GPT partition table (gpt)": func(path string) {
			src, _ := os.ReadFile(image)
			_ = os.WriteFile(path, src, 0o644)
			_ = os.Truncate(path, 8<<20)
		},
		"an MBR partition table (dos)": func(path string) {
			b := make([]byte, 8<<20)
			b[446+4] = 0x83
			b[510], b[511] = 0x55, 0xAA
			_ = os.WriteFile(path, b, 0o644)
		},
		"an ext4 filesystem (ext4)": func(path string) {
			_ = os.WriteFile(path, nil, 0o644)
			_ = os.Truncate(path, 8<<20)
			mkfs, err := exec.LookPath("mkfs.ext4")
			if err != nil {
				testkit.Unavailable(t, "mkfs.ext4 not installed (Debian: e2fsprogs)")
			}
			if out, err := supervisor.Run(mkfs, "-q", "-F", path); err != nil {
				t.Fatalf("mkfs.ext4: %v\n%s", err, out)
			}
		},
		"a LUKS volume (crypto_LUKS)": func(path string) {
			b := make([]byte, 8<<20)
			copy(b, "LUKS\xba\xbe")
			_ = os.WriteFile(path, b, 0o644)
		},
	}
	for what, make := range cases {
		disk := filepath.Join(dir, "used.img")
		make(disk)
		refusedOneLine(t, "refusing to install onto "+disk+": it holds "+what+"; pass --wipe", "--disk", disk, "--image", image)
		code, out, errs := runInstall(t, "--disk", disk, "--image", image, "--wipe")
		if code != 0 || !strings.Contains(out, "--wipe: overwriting "+what) {
			t.Fatalf("%s with --wipe: exit %d: %s%s", what, code, out, errs)
		}
		sameStart(t, image, disk) // old bytes past the image are gone too
	}
}

func TestInstallRefusals(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 8<<20)
	small := emptyDisk(t, dir, 4<<20)
	refusedOneLine(t, "is smaller than the image", "--disk", small, "--image", image)
	refusedOneLine(t, "--disk is required", "--image", image)
	refusedOneLine(t, "no such file or directory", "--disk", filepath.Join(dir, "nope"), "--image", image)
	refusedOneLine(t, "image: "+filepath.Join(dir, "nope.raw"), "--disk", small, "--image", filepath.Join(dir, "nope.raw"))
	refusedOneLine(t, "is neither a block device nor a disk image file", "--disk", dir, "--image", image)
	refusedOneLine(t, "is the image itself", "--disk", image, "--image", image, "--wipe")
	refusedOneLine(t, "unexpected argument", "--disk", small, "--image", image, "extra")
	if b, _ := os.ReadFile(small); bytes.IndexFunc(b, func(r rune) bool { return r != 0 }) >= 0 {
		t.Fatal("a refused install wrote to the disk")
	}
}

// --check runs the same checks and writes nothing: what `kiln install` asks before it builds an image.
func TestInstallCheckWritesNothing(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 8<<20)
	disk := emptyDisk(t, dir, 32<<20)
	code, out, errs := runInstall(t, "--check", "--disk", disk, "--size", "16777216")
	if code != 0 || !strings.Contains(out, disk+" can take the image (16 MiB onto 32 MiB); nothing written") {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	if code, _, errs := runInstall(t, "--check", "--disk", disk, "--image", image); code != 0 {
		t.Fatalf("--check --image: exit %d: %s", code, errs)
	}
	refusedOneLine(t, "is smaller than the image (67108864 bytes)", "--check", "--disk", disk, "--size", "67108864")
	refusedOneLine(t, "--check needs --image or --size", "--check", "--disk", disk)
	refusedOneLine(t, "--size goes with --check", "--disk", disk, "--image", image, "--size", "1")
	refusedOneLine(t, "no such file or directory", "--check", "--disk", filepath.Join(dir, "nope"), "--size", "1")
	used := filepath.Join(dir, "used.img")
	src, _ := os.ReadFile(image)
	if err := os.WriteFile(used, src, 0o644); err != nil {
		t.Fatal(err)
	}
	refusedOneLine(t, "it holds a GPT partition table (gpt); pass --wipe", "--check", "--disk", used, "--size", "1")
	if code, _, errs := runInstall(t, "--check", "--disk", used, "--size", "1", "--wipe"); code != 0 {
		t.Fatalf("--check --wipe: exit %d: %s", code, errs)
	}
	if b, _ := os.ReadFile(disk); bytes.IndexFunc(b, func(r rune) bool { return r != 0 }) >= 0 {
		t.Fatal("--check wrote to the disk")
	}
	if b, _ := os.ReadFile(used); !bytes.Equal(b, src) {
		t.Fatal("--check --wipe wrote to the disk")
	}
}

// As root with losetup: a real block device, written in full and its table re-read.
func TestInstallOntoLoopDevice(t *testing.T) {
	losetup, err := exec.LookPath("losetup")
	if os.Geteuid() != 0 || err != nil {
		testkit.Unavailable(t, "needs root and losetup for a loop device")
	}
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 8<<20)
	backing := emptyDisk(t, dir, 16<<20)
	// stale data at the end (an old backup GPT) is refused without --wipe and gone after it
	f, _ := os.OpenFile(backing, os.O_RDWR, 0)
	_, _ = f.WriteAt([]byte("EFI PART"), 16<<20-512)
	f.Close()
	out, err := supervisor.Run(losetup, "--find", "--show", "--partscan", backing)
	if err != nil {
		testkit.Unavailable(t, "losetup: %v (no loop devices here?)", err)
	}
	dev := strings.TrimSpace(out)
	defer func() { _, _ = supervisor.Run(losetup, "--detach", dev) }()
	refusedOneLine(t, "refusing to install onto "+dev+": it holds a backup GPT header (gpt); pass --wipe", "--disk", dev, "--image", image)
	code, stdout, errs := runInstall(t, "--disk", dev, "--image", image, "--wipe")
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, stdout, errs)
	}
	if !strings.Contains(stdout, "re-read "+dev+"'s partition table") {
		t.Fatalf("no re-read: %s", stdout)
	}
	sameStart(t, image, backing)
	if !kernelReadsGPT() {
		t.Log("this kernel has no GPT parser (CONFIG_EFI_PARTITION): partition nodes not checked")
		return
	}
	if !waitFor(func() bool { return exists(dev + "p2") }, 5e9) {
		t.Fatalf("%sp2 did not appear after BLKRRPART", dev)
	}
}

// kernelReadsGPT: false when /proc/config.gz says the kernel was built without a GPT parser
// (this project's development VMs are); true when it does not say.
func kernelReadsGPT() bool {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return true
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return true
	}
	config, _ := io.ReadAll(zr)
	return bytes.Contains(config, []byte("\nCONFIG_EFI_PARTITION=y"))
}

// After an install onto a bigger disk the backup GPT is not at the end, and sfdisk warns so
// before its JSON; machined reads the layout from that combined output on the first boot.
func TestLayoutReadableAfterInstallOntoBiggerDisk(t *testing.T) {
	dir := t.TempDir()
	image := testkit.GPTImage(t, dir, 4<<20)
	disk := emptyDisk(t, dir, 16<<20)
	if code, _, errs := runInstall(t, "--disk", disk, "--image", image); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	out, err := supervisor.Run(sfdiskPath(t), "--json", disk)
	if err != nil {
		t.Fatalf("sfdisk --json: %v\n%s", err, out)
	}
	if !strings.Contains(out, "backup GPT table is not on the end") {
		t.Fatalf("sfdisk did not warn as expected:\n%s", out)
	}
	layout, err := diskpkg.ParseSfdiskJSON([]byte(out))
	if err != nil || len(layout.Partitions) != 2 {
		t.Fatalf("layout %+v, %v", layout, err)
	}
}

func sfdiskPath(t *testing.T) string {
	t.Helper()
	sf, err := exec.LookPath("sfdisk")
	if err != nil {
		testkit.Unavailable(t, "sfdisk not installed (Debian: fdisk)")
	}
	return sf
}
