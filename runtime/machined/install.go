package main

// `machined install` writes Kiln's raw disk image onto a target disk, so the installed disk
// has exactly the image's layout (EFI, BIOS, BOOT, META); machined creates STATE and
// EPHEMERAL in the free space on the first boot, moving the backup GPT to the disk's end.
// The installer container and `kiln install` on the host both run this one implementation.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	// disk is install's name for the target, so the package goes by another here
	diskpkg "kiln/machined/internal/disk"
)

const (
	installBlock = 1 << 20 // write unit; also the sparse-skip granularity
	// gzipSizeID tags the FEXTRA subfield (RFC 1952 2.3.1.1) holding the raw image's size
	// as 8 bytes little-endian, so a compressed image's size is known without inflating it.
	gzipSizeID = "KS"
)

// defaultImages are tried in order when --image is not given (the installer container's).
var defaultImages = []string{"/usr/share/kiln/disk.raw.gz", "/usr/share/kiln/disk.raw"}

// installError carries the exit code: 2 for what the user can fix, 1 for a failed write.
type installError struct {
	code int
	msg  string
}

func (e *installError) Error() string { return e.msg }

func refuse(format string, a ...interface{}) error {
	return &installError{2, fmt.Sprintf(format, a...)}
}

// refuseInUse refuses a disk something on this machine uses; --wipe does not override it.
func refuseInUse(disk, why string) error {
	return refuse("refusing to install onto %s: it is in use: %s; --wipe does not override this", disk, why)
}

func failed(format string, a ...interface{}) error {
	return &installError{1, fmt.Sprintf(format, a...)}
}

// installMain is `machined install ...`; it returns the process's exit code.
func installMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "--upgrade" || args[0] == "-upgrade") {
		return upgradeMain(args[1:], stdout, stderr) // upgrade_install.go
	}
	fs := flag.NewFlagSet("machined install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	disk := fs.String("disk", "", "target disk: a block device or a disk image file (required)")
	image := fs.String("image", "", "raw disk image, plain or gzip (default: "+defaultImages[0]+" or "+defaultImages[1]+")")
	wipe := fs.Bool("wipe", false, "overwrite a disk that is not empty (never one in use: mounted, swap, held or claimed)")
	check := fs.Bool("check", false, "only check that --disk can take the image (--image's size, or --size): write nothing")
	size := fs.Int64("size", 0, "with --check and no --image: the size in bytes of the image to be written")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "install: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *disk == "" {
		fmt.Fprintln(stderr, "install: --disk is required (the disk to install onto)")
		return 2
	}
	if *check {
		return exitCode(checkOnly(*image, *size, *disk, *wipe, installSay(stdout)), stderr)
	}
	if *size != 0 {
		fmt.Fprintln(stderr, "install: --size goes with --check (an image has its own size)")
		return 2
	}
	if *image == "" {
		*image = defaultImages[0]
		for _, p := range defaultImages {
			if exists(p) {
				*image = p
				break
			}
		}
	}
	return exitCode(install(*image, *disk, *wipe, installSay(stdout)), stderr)
}

// installSay prints one "install: ..." progress line.
func installSay(stdout io.Writer) func(string, ...interface{}) {
	return func(f string, a ...interface{}) { fmt.Fprintf(stdout, "install: "+f+"\n", a...) }
}

// exitCode reports err on stderr as one "install: ..." line and returns the exit code: the
// installError's own (2 for a refusal), 1 for anything else, 0 without an error.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	code := 1
	var ie *installError
	if errors.As(err, &ie) {
		code = ie.code
	}
	fmt.Fprintf(stderr, "install: %v\n", err)
	return code
}

// sourceImage is the image to write: its raw size and a reader of its raw bytes.
type sourceImage struct {
	size       int64
	compressed bool
	open       func() (io.ReadCloser, error)
}

// openImage recognises gzip by its magic, not by the file's name. A gzip image without
// Kiln's size field is inflated once to count its bytes.
func openImage(path string) (*sourceImage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, refuse("image: %v", unwrapPath(err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return nil, refuse("image %s is not a regular file", path)
	}
	magic := make([]byte, 2)
	if n, _ := f.ReadAt(magic, 0); n < 2 || magic[0] != 0x1f || magic[1] != 0x8b {
		return &sourceImage{size: st.Size(), open: func() (io.ReadCloser, error) { return os.Open(path) }}, nil
	}
	open := func() (io.ReadCloser, error) {
		g, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		zr, err := gzip.NewReader(bufio.NewReaderSize(g, 1<<20))
		if err != nil {
			g.Close()
			return nil, err
		}
		zr.Multistream(false)
		return &gzipFile{zr, g}, nil
	}
	rc, err := open()
	if err != nil {
		return nil, refuse("image %s: %v", path, err)
	}
	defer rc.Close()
	src := &sourceImage{size: -1, compressed: true, open: open}
	if size, ok := gzipSize(rc.(*gzipFile).Header.Extra); ok {
		src.size = size
	} else if src.size, err = io.Copy(io.Discard, rc); err != nil {
		return nil, refuse("image %s: %v", path, err)
	}
	return src, nil
}

type gzipFile struct {
	*gzip.Reader
	file *os.File
}

func (g *gzipFile) Close() error {
	g.Reader.Close()
	return g.file.Close()
}

// gzipSize finds the KS subfield in a gzip header's FEXTRA.
func gzipSize(extra []byte) (int64, bool) {
	for len(extra) >= 4 {
		id, n := string(extra[:2]), int(binary.LittleEndian.Uint16(extra[2:4]))
		if len(extra) < 4+n {
			break
		}
		if id == gzipSizeID && n == 8 {
			return int64(binary.LittleEndian.Uint64(extra[4:12])), true
		}
		extra = extra[4+n:]
	}
	return 0, false
}

// target is the disk install writes: open for writing (exclusively, when a block device), checked.
type target struct {
	f       *os.File
	size    int64
	isBlock bool
}

// openTarget runs every check on disk before anything is written: a block device or a regular
// file, not the image itself, not in use, as large as the image (imageSize bytes), and empty
// unless wipe. `kiln install` runs these first (checkOnly), so a wrong disk costs no image build.
func openTarget(imagePath string, imageSize int64, disk string, wipe bool, say func(string, ...interface{})) (*target, error) {
	st, err := os.Stat(disk)
	if err != nil {
		return nil, refuse("disk: %v", unwrapPath(err))
	}
	if imagePath != "" {
		if ist, err := os.Stat(imagePath); err == nil && os.SameFile(ist, st) {
			return nil, refuse("%s is the image itself", disk)
		}
	}
	isBlock := st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0
	if !isBlock && !st.Mode().IsRegular() {
		return nil, refuse("%s is neither a block device nor a disk image file", disk)
	}
	if isBlock {
		if users := diskpkg.Users("/sys", "/proc", disk, uint64(st.Sys().(*syscall.Stat_t).Rdev)); len(users) > 0 {
			return nil, refuseInUse(disk, strings.Join(users, ", "))
		}
	}
	flags := os.O_RDWR
	if isBlock {
		flags |= syscall.O_EXCL // on a block device: fail if it is mounted or otherwise claimed
	}
	f, err := os.OpenFile(disk, flags, 0)
	if err != nil {
		if errors.Is(err, syscall.EBUSY) {
			return nil, refuseInUse(disk, "opening it exclusively failed (a mount, swap, device-mapper, md or a program holds it)")
		}
		return nil, refuse("disk: %v", unwrapPath(err))
	}
	t := &target{f: f, isBlock: isBlock}
	if t.size, err = f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return nil, failed("%s: size: %v", disk, err)
	}
	if t.size < imageSize {
		f.Close()
		return nil, refuse("%s (%d bytes) is smaller than the image (%d bytes)", disk, t.size, imageSize)
	}
	found, tools, err := diskpkg.Content(f, disk, t.size)
	switch {
	case err != nil && !wipe:
		f.Close()
		return nil, refuse("refusing to install onto %s: cannot tell whether it holds data (%v); pass --wipe to overwrite it", disk, err)
	case err != nil:
		say("warning: --wipe: cannot probe %s (%v); overwriting it", disk, err)
	case len(found) > 0 && !wipe:
		f.Close()
		return nil, refuse("refusing to install onto %s: it holds %s; pass --wipe to overwrite it", disk, diskpkg.JoinFindings(found))
	case len(found) > 0:
		say("--wipe: overwriting %s on %s", diskpkg.JoinFindings(found), disk)
	default:
		say("%s is empty (checked by %s; first and last MiB zero)", disk, strings.Join(tools, " and "))
	}
	return t, nil
}

// checkOnly is `machined install --check`: openTarget's checks for an image of imagePath's size
// (or size bytes, when the image is not made yet), and nothing written.
func checkOnly(imagePath string, size int64, disk string, wipe bool, say func(string, ...interface{})) error {
	if imagePath != "" {
		src, err := openImage(imagePath)
		if err != nil {
			return err
		}
		size = src.size
	} else if size <= 0 {
		return refuse("--check needs --image or --size BYTES (the size of the image to be written)")
	}
	t, err := openTarget(imagePath, size, disk, wipe, say)
	if err != nil {
		return err
	}
	t.f.Close()
	say("%s can take the image (%d MiB onto %d MiB); nothing written", disk, size>>20, t.size>>20)
	return nil
}

// install writes the image at imagePath onto disk; say prints a progress line.
func install(imagePath, disk string, wipe bool, say func(string, ...interface{})) error {
	src, err := openImage(imagePath)
	if err != nil {
		return err
	}
	t, err := openTarget(imagePath, src.size, disk, wipe, say)
	if err != nil {
		return err
	}
	defer t.f.Close()
	f, diskSize, isBlock := t.f, t.size, t.isBlock
	kind := "raw"
	if src.compressed {
		kind = "gzip"
	}
	say("writing %s (%s, %d MiB) to %s (%d MiB)", imagePath, kind, src.size>>20, disk, diskSize>>20)
	start := time.Now()
	sparse := !isBlock
	if sparse {
		// A file becomes all zeros, its size kept, so skipped zero blocks read as zeros.
		if err := f.Truncate(0); err != nil {
			return failed("%s: %v", disk, err)
		}
		if err := f.Truncate(diskSize); err != nil {
			return failed("%s: %v", disk, err)
		}
	}
	rc, err := src.open()
	if err != nil {
		return failed("image %s: %v", imagePath, err)
	}
	defer rc.Close()
	written, err := copyImage(f, rc, src.size, sparse, say)
	if err != nil {
		return failed("writing %s: %v", disk, err)
	}
	if isBlock && diskSize-written >= installBlock {
		// a backup GPT left by an earlier table at the end would confuse partitioning tools
		if _, err := f.WriteAt(make([]byte, installBlock), diskSize-installBlock); err != nil {
			return failed("clearing the end of %s: %v", disk, err)
		}
	}
	if err := f.Sync(); err != nil {
		return failed("fsync %s: %v", disk, err)
	}
	say("synced %d MiB in %.1f s", written>>20, time.Since(start).Seconds())
	if isBlock {
		const blkrrpart = 0x125f
		if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), blkrrpart, 0); errno != 0 {
			say("warning: the kernel did not re-read %s's partition table (%v); reboot or run partprobe", disk, errno)
		} else {
			say("the kernel re-read %s's partition table", disk)
		}
	}
	say("done: %s now holds the image", disk)
	return nil
}

// copyImage writes exactly size bytes from r to f from offset 0, skipping all-zero blocks
// when sparse; it prints a progress line at every tenth.
func copyImage(f *os.File, r io.Reader, size int64, sparse bool, say func(string, ...interface{})) (int64, error) {
	buf := make([]byte, installBlock)
	zero := make([]byte, installBlock)
	var off int64
	next := int64(1)
	for off < size {
		want := int64(len(buf))
		if size-off < want {
			want = size - off
		}
		n, err := io.ReadFull(r, buf[:want])
		if err != nil {
			return off, fmt.Errorf("the image ends after %d of %d bytes: %v", off+int64(n), size, err)
		}
		if !sparse || !bytes.Equal(buf[:n], zero[:n]) {
			if _, err := f.WriteAt(buf[:n], off); err != nil {
				return off, err
			}
		}
		off += int64(n)
		for size > 0 && off*10 >= next*size && next <= 10 {
			say("%d%% (%d/%d MiB)", next*10, off>>20, size>>20)
			next++
		}
	}
	// reading to the end also makes gzip check its CRC and length
	if extra, err := r.Read(buf[:1]); extra > 0 {
		return off, fmt.Errorf("the image is longer than its recorded size (%d bytes)", size)
	} else if err != nil && err != io.EOF {
		return off, fmt.Errorf("the image: %v", err)
	}
	return off, nil
}

// unwrapPath keeps a PathError's path and cause, without the operation ("open").
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %v", pe.Path, pe.Err)
	}
	return err
}

// exists says whether path exists (internal/disk keeps its own for sysfs).
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
