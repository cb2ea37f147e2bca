package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"kiln/machined/internal/disk"
)

type mountEntry struct {
	Target  string
	FSType  string
	Source  string
	Options string // per-mount options (ro/rw, nosuid, ...)
	Super   string // superblock options
}

// parseMountinfo reads /proc/self/mountinfo (proc(5)): mount point is field 5, per-mount
// options field 6, then optional fields up to "-", then type, source, superblock options.
func parseMountinfo(text string) []mountEntry {
	var out []mountEntry
	for _, line := range strings.Split(text, "\n") {
		fields := strings.Fields(line)
		sep := -1
		for i, f := range fields {
			if f == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || len(fields) < sep+3 {
			continue
		}
		e := mountEntry{Target: disk.UnescapeProcField(fields[4]), Options: fields[5], FSType: fields[sep+1], Source: disk.UnescapeProcField(fields[sep+2])}
		if len(fields) > sep+3 {
			e.Super = fields[sep+3]
		}
		out = append(out, e)
	}
	return out
}

// mountedAt returns the topmost mount at target (later lines stack over earlier ones).
func mountedAt(entries []mountEntry, target string) (mountEntry, bool) {
	for i := len(entries) - 1; i >= 0; i-- {
		if entries[i].Target == target {
			return entries[i], true
		}
	}
	return mountEntry{}, false
}

func hasOption(options, opt string) bool {
	for _, o := range strings.Split(options, ",") {
		if o == opt {
			return true
		}
	}
	return false
}

// rootReadOnly: Kiln's root is an immutable squashfs (or a read-only overlay of extensions
// over it); a writable / means something else booted us, and machined refuses to go on.
func rootReadOnly(entries []mountEntry) (bool, string) {
	root, ok := mountedAt(entries, "/")
	if !ok {
		return false, "no mount at / in mountinfo"
	}
	if hasOption(root.Options, "ro") || hasOption(root.Super, "ro") {
		return true, fmt.Sprintf("%s (%s)", root.FSType, root.Source)
	}
	return false, fmt.Sprintf("/ is %s (%s) mounted read-write", root.FSType, root.Source)
}

func readMounts() []mountEntry {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	return parseMountinfo(string(data))
}

type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

// baseMounts are mounted unless already there (init mounts the first four and moves them
// under the new root). /dev/pts and /dev/shm are for services that expect them.
var baseMounts = []mountSpec{
	{"proc", "/proc", "proc", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC, ""},
	{"sysfs", "/sys", "sysfs", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC, ""},
	{"devtmpfs", "/dev", "devtmpfs", syscall.MS_NOSUID, "mode=0755"},
	{"tmpfs", "/run", "tmpfs", syscall.MS_NOSUID | syscall.MS_NODEV, "mode=0755"},
	{"cgroup2", "/sys/fs/cgroup", "cgroup2", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC, "nsdelegate"},
	{"devpts", "/dev/pts", "devpts", syscall.MS_NOSUID | syscall.MS_NOEXEC, "mode=0620,ptmxmode=0666"},
	{"tmpfs", "/dev/shm", "tmpfs", syscall.MS_NOSUID | syscall.MS_NODEV, "mode=1777"},
	{"tmpfs", "/tmp", "tmpfs", syscall.MS_NOSUID | syscall.MS_NODEV, "mode=1777"},
}

// mountBase mounts what is missing. Mount points on the read-only root must exist in the
// rootfs (the fhs package makes them); ones under /dev and /sys/fs are created.
func mountBase() error {
	for _, m := range baseMounts {
		if _, ok := mountedAt(readMounts(), m.target); ok {
			continue
		}
		if err := mountOne(m); err != nil {
			// cgroup2's nsdelegate needs a recent kernel; retry plain before giving up
			if m.fstype == "cgroup2" && syscall.Mount(m.source, m.target, m.fstype, m.flags, "") == nil {
				continue
			}
			return err
		}
	}
	return nil
}

func mountOne(m mountSpec) error {
	if _, err := os.Stat(m.target); os.IsNotExist(err) {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return fmt.Errorf("mount point %s: %v", m.target, err)
		}
	}
	if err := syscall.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil {
		return fmt.Errorf("mount %s on %s: %v", m.fstype, m.target, err)
	}
	return nil
}
