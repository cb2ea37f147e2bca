package oci

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// Limits bound what one Unpack call may write. Both must be positive: an unbounded unpack of
// fetched content into a tmpfs is how PID 1 runs a machine out of memory.
type Limits struct {
	MaxBytes   int64 // regular-file bytes written, in total
	MaxEntries int   // tar headers read, directories and whiteouts included
}

const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	opaqueMarker   = ".wh..wh..opq"
	maxPath        = 4096    // PATH_MAX
	maxTrailing    = 1 << 20 // bytes allowed after the tar end marker (record padding is 10 KiB)
)

// Unpack applies one layer (a tar stream; gzip-compressed when mediaType ends in "+gzip" or is
// Docker's tar.gzip type) onto root, the way overlayfs would stack it on earlier layers:
//
//   - ".wh.NAME" removes NAME (file or tree) that earlier layers put there, and
//     ".wh..wh..opq" empties its directory of earlier layers' entries; entries of this
//     layer stay whatever the order.
//   - Names are cleaned and made relative; a name still holding ".." is refused, and so is any
//     entry whose parent directories include a symlink (each component is Lstat'ed, never
//     followed), so nothing is ever written outside root.
//   - Regular files (permissions only: setuid, setgid and sticky are dropped), directories,
//     symlinks (created as they are, never followed) and hard links to regular files already
//     in root. Devices, FIFOs and other types are refused. Ownership, times and xattrs are
//     not applied.
//
// It returns the regular-file bytes written. After the tar's end marker it reads the stream to
// its end, so a verifying reader underneath reports a digest mismatch, and returns that error.
// On error root is left part-written: unpack into a scratch directory.
func Unpack(root string, layer io.Reader, mediaType string, limits Limits) (int64, error) {
	if limits.MaxBytes <= 0 || limits.MaxEntries <= 0 {
		return 0, errors.New("unpack: limits must be positive")
	}
	st, err := os.Stat(root)
	if err != nil {
		return 0, fmt.Errorf("unpack: %w", err)
	}
	if !st.IsDir() {
		return 0, fmt.Errorf("unpack: %s is not a directory", root)
	}
	stream := layer
	switch {
	case strings.HasSuffix(mediaType, "+gzip") || mediaType == MediaTypeDockerLayer:
		gz, err := gzip.NewReader(layer)
		if err != nil {
			return 0, fmt.Errorf("unpack: layer is not gzip: %w", err)
		}
		stream = gz
	case strings.HasSuffix(mediaType, "+zstd"):
		return 0, fmt.Errorf("unpack: zstd layers (%s) are not supported: machined has only the standard library's gzip", quote(mediaType))
	case strings.HasSuffix(mediaType, ".tar"):
	default:
		return 0, fmt.Errorf("unpack: unsupported layer media type %s", quote(mediaType))
	}
	u := &unpacker{
		root:      root,
		limits:    limits,
		created:   map[string]bool{},
		ancestors: map[string]bool{},
		dirModes:  map[string]os.FileMode{},
	}
	tr := tar.NewReader(stream)
	for entries := 0; ; entries++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return u.written, fmt.Errorf("unpack: reading layer: %w", err)
		}
		if entries >= limits.MaxEntries {
			return u.written, fmt.Errorf("unpack: layer has more than %d entries", limits.MaxEntries)
		}
		if err := u.apply(hdr, tr); err != nil {
			return u.written, fmt.Errorf("unpack: layer entry %s: %w", quote(hdr.Name), err)
		}
	}
	if err := u.finish(); err != nil {
		return u.written, fmt.Errorf("unpack: %w", err)
	}
	if err := drain(stream); err != nil {
		return u.written, fmt.Errorf("unpack: after the tar end: %w", err)
	}
	if stream != layer {
		if err := drain(layer); err != nil {
			return u.written, fmt.Errorf("unpack: after the gzip end: %w", err)
		}
	}
	return u.written, nil
}

// drain reads what follows the tar end marker (padding) so the readers underneath see their
// end and check it; more than maxTrailing bytes there is refused, not read forever.
func drain(r io.Reader) error {
	n, err := io.Copy(io.Discard, io.LimitReader(r, maxTrailing+1))
	if err != nil {
		return err
	}
	if n > maxTrailing {
		return fmt.Errorf("more than %d bytes follow the tar end marker", maxTrailing)
	}
	return nil
}

type unpacker struct {
	root      string
	limits    Limits
	written   int64
	created   map[string]bool        // this layer's entries (clean relative paths)
	ancestors map[string]bool        // directories above this layer's entries
	dirModes  map[string]os.FileMode // applied at the end, so a 0555 directory can be filled first
}

// path is the on-disk path of a clean relative name.
func (u *unpacker) path(rel string) string { return filepath.Join(u.root, filepath.FromSlash(rel)) }

// cleanName cleans a tar name and makes it relative to root, refusing one that still climbs
// out ("../x", "a/../../x").
func cleanName(name string) (string, error) {
	switch {
	case name == "":
		return "", errors.New("empty name")
	case len(name) > maxPath:
		return "", fmt.Errorf("name longer than %d bytes", maxPath)
	case strings.ContainsRune(name, 0):
		return "", errors.New("name holds a NUL")
	}
	rel := strings.TrimLeft(path.Clean(name), "/") // "/../x" cleans to "/x", then "x"
	if rel == "" {
		rel = "."
	}
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", errors.New("name climbs out of the root with ..")
	}
	return rel, nil
}

func (u *unpacker) apply(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeReg && hdr.Size != 0 {
		return fmt.Errorf("a %s entry carries %d bytes of data", typeName(hdr.Typeflag), hdr.Size)
	}
	if base := path.Base(rel); strings.HasPrefix(base, whiteoutPrefix) {
		if hdr.Size != 0 {
			return errors.New("a whiteout carries data")
		}
		return u.whiteout(path.Dir(rel), base)
	}
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeChar, tar.TypeBlock:
		return errors.New("device nodes are not allowed")
	case tar.TypeFifo:
		return errors.New("FIFOs are not allowed")
	default:
		return fmt.Errorf("entry type %s is not allowed", typeName(hdr.Typeflag))
	}
	if rel == "." {
		if hdr.Typeflag == tar.TypeDir {
			return nil // the root itself: its mode is the caller's
		}
		return errors.New("only a directory may name the root")
	}
	if _, err := u.walkDir(path.Dir(rel), true); err != nil {
		return err
	}
	target := u.path(rel)
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = u.dir(rel, target, hdr.Mode)
	case tar.TypeReg:
		err = u.file(target, hdr, r)
	case tar.TypeSymlink:
		err = u.symlink(target, hdr.Linkname)
	case tar.TypeLink:
		err = u.hardlink(rel, target, hdr.Linkname)
	}
	if err != nil {
		return err
	}
	u.record(rel)
	return nil
}

func typeName(t byte) string {
	switch t {
	case tar.TypeReg:
		return "regular file"
	case tar.TypeDir:
		return "directory"
	case tar.TypeSymlink:
		return "symlink"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "FIFO"
	}
	return fmt.Sprintf("%q", t)
}

// record notes rel as this layer's, and its parents as holding this layer's entries. The
// parent strings share rel's memory, and the walk stops at the first known one.
func (u *unpacker) record(rel string) {
	u.created[rel] = true
	for i := len(rel) - 1; i > 0; i-- {
		if rel[i] != '/' {
			continue
		}
		if u.ancestors[rel[:i]] {
			break
		}
		u.ancestors[rel[:i]] = true
	}
}

// walkDir checks that every component of dir (relative, clean) is a real directory, never a
// symlink, creating missing ones (mode 0755) when create is set. Without create, a missing
// component reports false.
func (u *unpacker) walkDir(dir string, create bool) (bool, error) {
	if dir == "." {
		return true, nil
	}
	parts := strings.Split(dir, "/")
	cur := u.root
	for i, p := range parts {
		cur = filepath.Join(cur, p)
		fi, err := os.Lstat(cur)
		switch {
		case err == nil && fi.Mode()&fs.ModeSymlink != 0:
			return false, fmt.Errorf("parent %s is a symlink", quote(strings.Join(parts[:i+1], "/")))
		case err == nil && !fi.IsDir():
			return false, fmt.Errorf("parent %s is not a directory", quote(strings.Join(parts[:i+1], "/")))
		case err == nil:
		case errors.Is(err, fs.ErrNotExist) && create:
			if err := os.Mkdir(cur, 0o755); err != nil {
				return false, err
			}
		case errors.Is(err, fs.ErrNotExist):
			return false, nil
		default:
			return false, err
		}
	}
	return true, nil
}

// removeExisting clears the way for a new entry: an upper layer's entry replaces whatever was
// there, without following a symlink or writing through a hard link.
func removeExisting(target string) error {
	fi, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.IsDir():
		return os.RemoveAll(target)
	default:
		return os.Remove(target)
	}
}

func (u *unpacker) dir(rel, target string, mode int64) error {
	fi, err := os.Lstat(target)
	if err != nil || !fi.IsDir() {
		if err := removeExisting(target); err != nil {
			return err
		}
		if err := os.Mkdir(target, 0o755); err != nil {
			return err
		}
	}
	u.dirModes[rel] = os.FileMode(mode & 0o777)
	return nil
}

func (u *unpacker) file(target string, hdr *tar.Header, r io.Reader) error {
	if hdr.Size > u.limits.MaxBytes-u.written {
		return fmt.Errorf("%d bytes would pass the limit of %d bytes (%d left)", hdr.Size, u.limits.MaxBytes, u.limits.MaxBytes-u.written)
	}
	if err := removeExisting(target); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	n, err := io.CopyN(f, r, hdr.Size)
	u.written += n
	if err == nil {
		err = f.Chmod(os.FileMode(hdr.Mode & 0o777))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (u *unpacker) symlink(target, linkname string) error {
	switch {
	case linkname == "":
		return errors.New("symlink with an empty target")
	case len(linkname) > maxPath:
		return fmt.Errorf("symlink target longer than %d bytes", maxPath)
	case strings.ContainsRune(linkname, 0):
		return errors.New("symlink target holds a NUL")
	}
	if err := removeExisting(target); err != nil {
		return err
	}
	return os.Symlink(linkname, target)
}

// hardlink links to a regular file already in root, named the way entries are (relative to
// root, never through a symlink).
func (u *unpacker) hardlink(rel, target, linkname string) error {
	src, err := cleanName(linkname)
	if err != nil {
		return fmt.Errorf("hard link target %s: %w", quote(linkname), err)
	}
	if src == rel {
		return errors.New("hard link to itself")
	}
	ok, err := u.walkDir(path.Dir(src), false)
	if err != nil {
		return fmt.Errorf("hard link target %s: %w", quote(linkname), err)
	}
	var fi fs.FileInfo
	if ok {
		fi, err = os.Lstat(u.path(src))
	}
	if !ok || err != nil {
		return fmt.Errorf("hard link target %s does not exist", quote(linkname))
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("hard link target %s is not a regular file", quote(linkname))
	}
	if err := removeExisting(target); err != nil {
		return err
	}
	return os.Link(u.path(src), target)
}

// whiteout handles ".wh.NAME" and ".wh..wh..opq" in dir. They only hide what earlier layers
// left: this layer's own entries stay (the OCI image spec's rule).
func (u *unpacker) whiteout(dir, base string) error {
	name := strings.TrimPrefix(base, whiteoutPrefix)
	switch {
	case base == opaqueMarker:
	case strings.HasPrefix(base, whiteoutMeta):
		return errors.New("AUFS metadata entries are not supported")
	case name == "" || name == "." || name == "..":
		return errors.New("whiteout of nothing")
	}
	ok, err := u.walkDir(dir, false)
	if err != nil || !ok {
		return err // a missing directory has nothing to hide
	}
	if base == opaqueMarker {
		return u.prune(dir)
	}
	victim := path.Join(dir, name)
	if u.created[victim] || u.ancestors[victim] {
		fi, err := os.Lstat(u.path(victim))
		if err == nil && fi.IsDir() {
			return u.prune(victim)
		}
		return nil
	}
	return os.RemoveAll(u.path(victim))
}

// prune removes everything under dir that this layer did not put there, keeping this layer's
// entries and the directories leading to them.
func (u *unpacker) prune(dir string) error {
	entries, err := os.ReadDir(u.path(dir))
	if err != nil {
		return err
	}
	for _, e := range entries {
		child := path.Join(dir, e.Name())
		if !u.created[child] && !u.ancestors[child] {
			if err := os.RemoveAll(u.path(child)); err != nil {
				return err
			}
			continue
		}
		if e.IsDir() {
			if err := u.prune(child); err != nil {
				return err
			}
		}
	}
	return nil
}

// finish applies directory modes, through a descriptor opened without following symlinks, to
// directories that are still directories (a later entry may have replaced one).
func (u *unpacker) finish() error {
	for rel, mode := range u.dirModes {
		ok, err := u.walkDir(path.Dir(rel), false)
		if err != nil || !ok {
			continue
		}
		f, err := os.OpenFile(u.path(rel), os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			continue
		}
		err = f.Chmod(mode)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}
