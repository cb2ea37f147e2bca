package main

// The isolation an upgrade's installer runs in. machined mounts BOOT itself (owned, as vfat
// sees it, by the sandbox's user) and starts itself again as `machined upgrade-sandbox` in new
// mount, PID, network, IPC, UTS and cgroup namespaces. That helper, still root but alone in its
// namespaces, bind-mounts the unpacked image onto itself and BOOT at its /boot, pivot_roots into
// the image and detaches the old root (no path back to the machine's files; see pivotIntoCwd for
// the one case where it moves the image over / instead), remounts the image
// read-only, drops every capability from the bounding set, becomes the unprivileged sandbox user,
// sets no_new_privs and only then execs the image's installer. The installer so runs with no
// capability at all, cannot gain one (no setuid, no file capabilities), sees no device node,
// and can write only the slot's directory on BOOT and BOOT's grub directory (the boot state);
// the rest of BOOT it can read. docs/upgrades.md ("Install") says the same for users.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

const (
	sandboxCommand = "upgrade-sandbox"
	// sandboxID is the uid and gid the installer runs as; BOOT is mounted owned by it
	sandboxID = 65533
	// prctl options the syscall package does not name
	prSetNoNewPrivs     = 38
	prGetNoNewPrivs     = 39
	prCapAmbient        = 47
	prCapAmbientClear   = 4
	maxCapabilityNumber = 63
	cloneNewCgroup      = 0x02000000 // CLONE_NEWCGROUP, which the syscall package does not name
)

// sandboxExe is what the helper runs from: this machined (a variable so tests run theirs).
var sandboxExe = "/proc/self/exe"

// sandboxFlags are the namespaces the helper, and so the installer, starts in.
const sandboxFlags = syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC |
	syscall.CLONE_NEWUTS | cloneNewCgroup

// bootMountOptions: vfat has no owners, so BOOT shows every file as the sandbox user's.
func bootMountOptions() string {
	return fmt.Sprintf("uid=%d,gid=%d,umask=077", sandboxID, sandboxID)
}

// prepareSandboxRoot makes root/boot, the one mount point the helper needs in the image, and
// refuses an image whose /boot is anything but a directory (a link there would take the bind
// mount anywhere). root is machined's own directory and nothing of the image runs yet, so one
// look without following links is enough.
func prepareSandboxRoot(root string) error {
	target := filepath.Join(root, "boot")
	st, err := os.Lstat(target)
	switch {
	case os.IsNotExist(err):
		return os.Mkdir(target, 0o755)
	case err != nil:
		return err
	case !st.IsDir():
		return fmt.Errorf("the image's /boot is a %s, not a directory", kindOf(st.Mode()))
	}
	return nil
}

func kindOf(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "symbolic link"
	case m.IsRegular():
		return "file"
	}
	return "special file"
}

// sandboxMain is `machined upgrade-sandbox ROOT BOOTDIR WRITABLE PROGRAM [ARG...]`, started by
// runInstaller in new namespaces: WRITABLE names the directories of BOOT the program may write
// (the slot's and grub, for the boot state), comma-separated; the rest of BOOT is read-only. It
// never returns when it works: it execs PROGRAM.
func sandboxMain(args []string, stderr io.Writer) int {
	if len(args) < 4 || !filepath.IsAbs(args[0]) || !filepath.IsAbs(args[1]) || !filepath.IsAbs(args[3]) {
		fmt.Fprintln(stderr, "upgrade-sandbox: want ROOT BOOTDIR WRITABLE PROGRAM [ARG...], absolute paths")
		return 2
	}
	writable := strings.Split(args[2], ",")
	for _, w := range writable {
		if w != "A" && w != "B" && w != "grub" {
			fmt.Fprintf(stderr, "upgrade-sandbox: %q: BOOT's writable directories are A, B and grub\n", w)
			return 2
		}
	}
	// capabilities, no_new_privs and the exec belong to one thread
	runtime.LockOSThread()
	if err := enterSandbox(args[0], args[1], writable); err != nil {
		fmt.Fprintf(stderr, "upgrade-sandbox: %v\n", err)
		return 1
	}
	err := syscall.Exec(args[3], args[3:], []string{"PATH=/usr/bin:/bin", "HOME=/"})
	fmt.Fprintf(stderr, "upgrade-sandbox: exec %s: %v\n", args[3], err)
	return 1
}

// enterSandbox does everything but the exec; it must run in fresh namespaces.
func enterSandbox(root, bootDir string, writable []string) error {
	boot := filepath.Join(root, "boot")
	if os.Getpid() != 1 {
		return errors.New("not in its own PID namespace")
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"making the mounts private", func() error { return syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, "") }},
		{"binding the image", func() error { return syscall.Mount(root, root, "", syscall.MS_BIND, "") }},
		{"checking /boot", func() error { return prepareSandboxRoot(root) }},
		{"binding BOOT", func() error { return syscall.Mount(bootDir, boot, "", syscall.MS_BIND, "") }},
		{"BOOT read-only", func() error { return syscall.Mount("", boot, "", bootFlags|syscall.MS_RDONLY, "") }},
		{"BOOT's writable directories", func() error {
			// BOOT is vfat (no links) and mounted by machined: these joins stay on it
			for _, w := range writable {
				dir := filepath.Join(boot, w)
				if err := syscall.Mount(filepath.Join(bootDir, w), dir, "", syscall.MS_BIND, ""); err != nil {
					return fmt.Errorf("%s: %v", w, err)
				}
				if err := syscall.Mount("", dir, "", bootFlags, ""); err != nil {
					return fmt.Errorf("%s: %v", w, err)
				}
			}
			return nil
		}},
		{"entering the image", func() error { return syscall.Chdir(root) }},
		{"pivot_root", pivotIntoCwd},
		{"chdir /", func() error { return syscall.Chdir("/") }},
		{"the image read-only", func() error {
			return syscall.Mount("", "/", "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY|syscall.MS_NOSUID|syscall.MS_NODEV, "")
		}},
		{"dropping capabilities", dropCapabilities},
		{"becoming the sandbox user", func() error {
			if err := syscall.Setgroups([]int{}); err != nil {
				return err
			}
			if err := syscall.Setresgid(sandboxID, sandboxID, sandboxID); err != nil {
				return err
			}
			return syscall.Setresuid(sandboxID, sandboxID, sandboxID)
		}},
		{"no_new_privs", func() error { return prctl(prSetNoNewPrivs, 1) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("%s: %v", s.what, err)
		}
	}
	return nil
}

// pivotIntoCwd makes the current directory (a mount point) the root and detaches the old root.
// Where the machine's own root cannot be pivoted away from (a root moved over the initramfs's
// rootfs whose parent mount pivot_root refuses, EINVAL), it moves the directory over / and
// chroots there, as switch_root does: the old mounts stay below, out of reach of a process that
// has, as the installer will, no capability to chroot or mount again.
func pivotIntoCwd() error {
	err := syscall.PivotRoot(".", ".")
	if err == nil {
		return syscall.Unmount(".", syscall.MNT_DETACH)
	}
	if err != syscall.EINVAL {
		return err
	}
	if merr := syscall.Mount(".", "/", "", syscall.MS_MOVE, ""); merr != nil {
		return fmt.Errorf("%v; moving the image over / instead: %v", err, merr)
	}
	return syscall.Chroot(".")
}

// bootFlags remount a bind of BOOT: nothing on it runs, no device node on it opens
const bootFlags = syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC

// dropCapabilities empties this thread's bounding and ambient sets, so nothing it execs can
// hold a capability, root or not.
func dropCapabilities() error {
	_ = prctl(prCapAmbient, prCapAmbientClear) // kernels before 4.3 have no ambient set
	for c := 0; c <= maxCapabilityNumber; c++ {
		if err := prctl(syscall.PR_CAPBSET_DROP, uintptr(c)); err != nil {
			if err == syscall.EINVAL {
				break // past the kernel's last capability
			}
			return fmt.Errorf("capability %d: %v", c, err)
		}
	}
	return nil
}

func prctl(option, arg uintptr) error {
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRCTL, option, arg, 0, 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// sandboxArgs is the helper's command line; writable are BOOT's directories it may write.
func sandboxArgs(root, bootDir string, writable []string, program string, args ...string) []string {
	return append([]string{sandboxCommand, root, bootDir, strings.Join(writable, ","), program}, args...)
}

// lstatUnder looks at rel under root without following a link at any level (openat with
// O_NOFOLLOW from root down); root is the caller's own directory.
func lstatUnder(root, rel string) (syscall.Stat_t, error) {
	var st syscall.Stat_t
	parts := strings.Split(strings.Trim(rel, "/"), "/")
	dir, err := syscall.Open(root, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return st, err
	}
	defer func() { syscall.Close(dir) }()
	for i, p := range parts {
		if p == "" || p == "." || p == ".." {
			return st, fmt.Errorf("%s: not a plain relative path", rel)
		}
		flags := syscall.O_NOFOLLOW | syscall.O_CLOEXEC | 0x200000 // O_PATH
		if i < len(parts)-1 {
			flags |= syscall.O_DIRECTORY
		}
		fd, err := syscall.Openat(dir, p, flags, 0)
		if err != nil {
			return st, fmt.Errorf("%s: %v", strings.Join(parts[:i+1], "/"), err)
		}
		syscall.Close(dir)
		dir = fd
	}
	err = syscall.Fstat(dir, &st)
	return st, err
}
