// Package disk finds and prepares the disk machined owns: block devices from sysfs, the
// signatures on a disk and whether anything uses it, and the STATE and EPHEMERAL partitions
// planned into its free space and formatted on the first boot.
package disk

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"kiln/machined/internal/supervisor"
)

const sfdisk = "/usr/sbin/sfdisk"

// imagePartitions mark a disk Kiln's imager wrote (and a disk machined already set up).
var imagePartitions = map[string]bool{"BOOT": true, "META": true, partState: true, partEphemeral: true}

// ChooseDisk picks the disk machined owns, in this order: install.disk from the config;
// kiln.disk= on the kernel command line ("none" keeps the machine diskless); the disk
// holding BOOT/META (or STATE/EPHEMERAL); else the only blank disk (no signature and zeros
// in its first and last MiB, as a new virtual disk reads). No choice means a tmpfs /var.
func ChooseDisk(devs []BlockDev, configured, param string, blank func(path string) bool) (path, why string) {
	if configured != "" {
		return configured, "install.disk"
	}
	if param == "none" {
		return "", "kiln.disk=none"
	}
	if param != "" {
		return param, "kiln.disk"
	}
	for _, b := range devs {
		if b.IsPartition() && imagePartitions[b.PartName] {
			return "/dev/" + b.Disk, "it holds " + b.PartName
		}
	}
	var blanks []string
	for _, b := range devs {
		if !b.IsPartition() && !IsVirtualDisk(b.Name) && !strings.HasPrefix(b.Name, "sr") && !b.ReadOnly && b.Sectors > 0 && blank(b.Path) {
			blanks = append(blanks, b.Path)
		}
	}
	if len(blanks) == 1 {
		return blanks[0], "it is the only blank disk"
	}
	if len(blanks) > 1 {
		return "", fmt.Sprintf("%d blank disks and no install.disk to choose one", len(blanks))
	}
	return "", "no disk"
}

// Prepare makes sure STATE and EPHEMERAL exist with filesystems and returns their
// devices. First boot partitions (sfdisk) and formats (mkfs); later boots find them.
func Prepare(disk, filesystem string, say func(string, ...interface{})) (state, ephemeral string, err error) {
	name := filepath.Base(disk)
	if !exists(filepath.Join("/sys/class/block", name)) {
		if !WaitFor(func() bool { return exists(filepath.Join("/sys/class/block", name)) }, 10*time.Second) {
			return "", "", fmt.Errorf("%s does not exist", disk)
		}
	}
	layout, err := readLayout(disk)
	if err != nil {
		return "", "", err
	}
	plan, err := planPartitions(layout)
	if err != nil {
		return "", "", fmt.Errorf("%s: %v", disk, err)
	}
	if len(plan) > 0 {
		// stale signatures inside the new partitions would make them look formatted
		args := []string{"--quiet", "--wipe-partitions", "always"}
		if layout.HasTable {
			args = append(args, "--append")
		} else {
			args = append(args, "--wipe", "always")
		}
		if out, err := supervisor.RunInput([]byte(sfdiskScript(layout, plan)), sfdisk, append(args, disk)...); err != nil {
			return "", "", fmt.Errorf("partitioning %s: %v\n%s", disk, err, out)
		}
		for _, p := range plan {
			say("disk: created %s on %s (%d MiB)", p.Name, disk, p.Size*layout.SectorSize/mib)
		}
	}
	parts := map[string]string{}
	found := func() bool {
		for _, b := range ListBlockDevices("/sys") {
			if b.Disk == name && (b.PartName == partState || b.PartName == partEphemeral) {
				parts[b.PartName] = b.Path
			}
		}
		return parts[partState] != "" && parts[partEphemeral] != "" && exists(parts[partState]) && exists(parts[partEphemeral])
	}
	if !WaitFor(found, 10*time.Second) {
		rereadPartitions(disk)
		if !WaitFor(found, 5*time.Second) {
			return "", "", fmt.Errorf("%s: the kernel does not show STATE and EPHEMERAL", disk)
		}
	}
	if filesystem == "" {
		filesystem = "ext4"
	}
	for _, p := range []struct{ name, fs string }{{partState, "ext4"}, {partEphemeral, filesystem}} {
		if err := ensureFilesystem(parts[p.name], p.fs, p.name, say); err != nil {
			return "", "", err
		}
	}
	return parts[partState], parts[partEphemeral], nil
}

// readLayout asks sfdisk for the partition table. A disk without one must be blank:
// machined never writes a new table over data it does not recognise. A GPT whose backup
// header sits before the disk's end (an image written to a bigger disk) is moved to the
// end first, so the free space becomes usable.
func readLayout(disk string) (DiskLayout, error) {
	sectors, sectorSize := diskSize(disk)
	out, err := supervisor.Run(sfdisk, "--json", disk)
	if err != nil {
		if !IsBlank(disk) {
			return DiskLayout{}, fmt.Errorf("%s has no partition table machined can read and is not blank: %v", disk, err)
		}
		return DiskLayout{SectorSize: sectorSize, Sectors: sectors}, nil
	}
	layout, err := ParseSfdiskJSON([]byte(out))
	if err != nil {
		return layout, fmt.Errorf("%s: %v", disk, err)
	}
	layout.Sectors = sectors
	backup := (128*128+layout.SectorSize-1)/layout.SectorSize + 1
	if layout.LastLBA+backup+1 < sectors {
		if out, err := supervisor.Run(sfdisk, "--quiet", "--relocate", "gpt-bak-std", disk); err != nil {
			return layout, fmt.Errorf("moving %s's backup GPT to the end: %v\n%s", disk, err, out)
		}
		if out, err = supervisor.Run(sfdisk, "--json", disk); err == nil {
			layout, err = ParseSfdiskJSON([]byte(out))
			layout.Sectors = sectors
		}
		if err != nil {
			return layout, fmt.Errorf("%s: %v", disk, err)
		}
	}
	return layout, nil
}

// diskSize reads the size and logical sector size from sysfs (sizes there are in 512s).
func diskSize(disk string) (sectors, sectorSize uint64) {
	sys := filepath.Join("/sys/class/block", filepath.Base(disk))
	sectorSize = readUint(filepath.Join(sys, "queue", "logical_block_size"))
	if sectorSize == 0 {
		sectorSize = 512
	}
	return readUint(filepath.Join(sys, "size")) * 512 / sectorSize, sectorSize
}

// rereadPartitions asks the kernel to re-read the table (BLKRRPART), in case sfdisk could not.
func rereadPartitions(disk string) {
	f, err := os.Open(disk)
	if err != nil {
		return
	}
	defer f.Close()
	const blkrrpart = 0x125f
	_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), blkrrpart, 0)
}

// ensureFilesystem formats a partition that has no filesystem yet; one that has any
// filesystem is left alone (its data is what /var must keep across reboots).
func ensureFilesystem(dev, fstype, label string, say func(string, ...interface{})) error {
	have, _, err := ProbeFS(dev)
	if err != nil {
		return err
	}
	if have != "" {
		return nil
	}
	var out string
	switch fstype {
	case "xfs":
		out, err = supervisor.Run("/usr/sbin/mkfs.xfs", "-q", "-f", "-L", label, dev)
	default:
		out, err = supervisor.Run("/usr/sbin/mkfs.ext4", "-q", "-F", "-L", label, dev)
	}
	if err != nil {
		return fmt.Errorf("mkfs.%s %s: %v\n%s", fstype, dev, err, out)
	}
	say("disk: formatted %s (%s) as %s", label, dev, fstype)
	return nil
}

// WaitFor polls cond every 100 ms until it holds (true) or max has passed (false).
func WaitFor(cond func() bool, max time.Duration) bool {
	deadline := time.Now().Add(max)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}
