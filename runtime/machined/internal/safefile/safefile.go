// Package safefile reads files from a filesystem machined does not trust: a config drive, a
// platform's provisioning drive, the STATE partition. Whoever wrote the medium chose its links,
// file types and sizes, so a read here never follows a symlink (at any level of the path), only
// ever opens regular files (a FIFO would block PID 1, a device could be /dev/zero), and stops
// at a size cap (a read without one is an out-of-memory reboot loop for PID 1).
package safefile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"syscall"
)

// ErrNotRegular is returned (wrapped) for a symlink, directory, FIFO, socket or device
// where a regular file was asked for.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is returned (wrapped) for a file over the size cap.
var ErrTooLarge = errors.New("too large")

// ReadUnder reads the regular file rel (slash-separated, relative, no "." or ".." parts)
// under the directory root, at most max bytes. Each directory on the way is opened with
// O_NOFOLLOW from the one before (openat), so no link anywhere in rel is followed; root
// itself is the caller's own path (a mount point it chose) and is trusted. A missing file
// is an error for which errors.Is(err, os.ErrNotExist) holds.
func ReadUnder(root, rel string, max int64) ([]byte, error) {
	parts, err := split(rel)
	if err != nil {
		return nil, err
	}
	dir, err := syscall.Open(root, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer func() { syscall.Close(dir) }()
	for _, part := range parts[:len(parts)-1] {
		next, err := syscall.Openat(dir, part, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if err != nil {
			return nil, pathError(rel, err)
		}
		syscall.Close(dir)
		dir = next
	}
	return readAt(dir, parts[len(parts)-1], rel, max)
}

// ReadFile reads the regular file at path, not following a link in its last component, at
// most max bytes: for a path whose directories are the caller's own.
func ReadFile(p string, max int64) ([]byte, error) {
	dir, name := path.Split(p)
	if dir == "" {
		dir = "."
	}
	if name == "" || name == "." || name == ".." {
		return nil, fmt.Errorf("%s: %w", p, ErrNotRegular)
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer syscall.Close(fd)
	return readAt(fd, name, p, max)
}

// readAt looks at name in dir through an O_PATH descriptor (which opens nothing: a device
// never sees an open), then opens it without following a link and without blocking, checks
// it is the same inode, still regular, and reads at most max bytes.
func readAt(dir int, name, shown string, max int64) ([]byte, error) {
	pfd, err := syscall.Openat(dir, name, _O_PATH|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathError(shown, err)
	}
	var before syscall.Stat_t
	err = syscall.Fstat(pfd, &before)
	syscall.Close(pfd)
	if err != nil {
		return nil, pathError(shown, err)
	}
	if err := check(&before, shown, max); err != nil {
		return nil, err
	}
	fd, err := syscall.Openat(dir, name, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathError(shown, err)
	}
	f := os.NewFile(uintptr(fd), shown)
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, pathError(shown, err)
	}
	if st.Dev != before.Dev || st.Ino != before.Ino {
		return nil, fmt.Errorf("%s: changed while being read: %w", shown, ErrNotRegular)
	}
	if err := check(&st, shown, max); err != nil {
		return nil, err
	}
	data, err := ReadAtMost(f, max)
	if errors.Is(err, ErrTooLarge) {
		return nil, fmt.Errorf("%s: more than %d bytes: %w", shown, max, ErrTooLarge)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", shown, err)
	}
	return data, nil
}

// ReadAtMost reads all of r if it holds at most max bytes; more is ErrTooLarge (callers name
// what was too large), never a silent truncation, and no more than max+1 bytes are read.
func ReadAtMost(r io.Reader, max int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, ErrTooLarge
	}
	return data, nil
}

// _O_PATH is O_PATH, the same on amd64 and arm64 (the syscall package does not name it).
const _O_PATH = 0x200000

func check(st *syscall.Stat_t, shown string, max int64) error {
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
	case syscall.S_IFLNK:
		return fmt.Errorf("%s: a symlink: %w", shown, ErrNotRegular)
	default:
		return fmt.Errorf("%s: %w", shown, ErrNotRegular)
	}
	if st.Size > max {
		return fmt.Errorf("%s: more than %d bytes (%d): %w", shown, max, st.Size, ErrTooLarge)
	}
	return nil
}

// split checks rel is a plain relative path and returns its parts.
func split(rel string) ([]string, error) {
	if rel == "" || strings.HasPrefix(rel, "/") || path.Clean(rel) != rel || rel == "." ||
		rel == ".." || strings.HasPrefix(rel, "../") || strings.ContainsRune(rel, 0) {
		return nil, fmt.Errorf("%q: not a plain relative path", rel)
	}
	return strings.Split(rel, "/"), nil
}

// pathError names rel in err; ELOOP (a link met with O_NOFOLLOW) and ENOTDIR (a link or a
// file where a directory was expected) say what they mean.
func pathError(rel string, err error) error {
	switch err {
	case syscall.ELOOP:
		return fmt.Errorf("%s: a symlink: %w", rel, ErrNotRegular)
	case syscall.ENOTDIR:
		return fmt.Errorf("%s: a path through a symlink or file: %w", rel, ErrNotRegular)
	}
	return &os.PathError{Op: "open", Path: rel, Err: err}
}
