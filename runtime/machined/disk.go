package main

import (
	"fmt"
	"os"
	"syscall"

	"kiln/machined/internal/disk"
)

// stateMount is where STATE is mounted (machined keeps the machine config there).
const stateMount = "/run/kiln/state"

// mountFS mounts a device, its type probed, at target.
func mountFS(dev, target string, flags uintptr) error {
	fstype, _, err := disk.ProbeFS(dev)
	if err != nil {
		return err
	}
	if fstype == "" {
		return fmt.Errorf("%s has no filesystem", dev)
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := syscall.Mount(dev, target, fstype, flags, ""); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %v", dev, fstype, target, err)
	}
	return nil
}

// populateVar creates what the rootfs's /var held, which the mount now hides.
func populateVar() {
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{"/var/log", 0o755}, {"/var/lib", 0o755}, {"/var/cache", 0o755}, {"/var/tmp", 0o1777}} {
		_ = os.MkdirAll(d.path, d.mode)
		_ = os.Chmod(d.path, d.mode)
	}
	if _, err := os.Lstat("/var/run"); os.IsNotExist(err) {
		_ = os.Symlink("../run", "/var/run")
	}
}
