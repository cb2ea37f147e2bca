package disk

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// BlockDev is one entry of /sys/class/block. There is no udev on a Kiln machine, so
// partition names come from the kernel's uevent (PARTNAME, from the GPT) and filesystem
// labels from ProbeFS.
type BlockDev struct {
	Name      string // vda, vda2, sr0
	Path      string // /dev/vda2
	Disk      string // the parent disk's name, for partitions
	PartName  string // GPT partition name (STATE, EPHEMERAL, BOOT, ...)
	PartNum   int
	Sectors   uint64 // in 512-byte units, as sysfs counts
	Removable bool
	ReadOnly  bool
}

// IsPartition says whether the device is a partition of a disk.
func (b BlockDev) IsPartition() bool { return b.Disk != "" }

// ListBlockDevices reads <sysRoot>/class/block; sysRoot is /sys (a fake tree in tests).
func ListBlockDevices(sysRoot string) []BlockDev {
	dir := filepath.Join(sysRoot, "class", "block")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []BlockDev
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		uevent := readUevent(filepath.Join(path, "uevent"))
		b := BlockDev{Name: e.Name(), Path: "/dev/" + e.Name(), PartName: uevent["PARTNAME"]}
		if n := uevent["DEVNAME"]; n != "" {
			b.Path = "/dev/" + n
		}
		b.Sectors = readUint(filepath.Join(path, "size"))
		b.ReadOnly = readUint(filepath.Join(path, "ro")) == 1
		if uevent["DEVTYPE"] == "partition" || exists(filepath.Join(path, "partition")) {
			b.PartNum = int(readUint(filepath.Join(path, "partition")))
			if real, err := filepath.EvalSymlinks(path); err == nil {
				b.Disk = filepath.Base(filepath.Dir(real))
			}
		} else {
			b.Removable = readUint(filepath.Join(path, "removable")) == 1
		}
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func readUevent(path string) map[string]string {
	out := map[string]string{}
	data, _ := os.ReadFile(path)
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

func readUint(path string) uint64 {
	data, _ := os.ReadFile(path)
	n, _ := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	return n
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// IsVirtualDisk says whether a device is virtual: loop, ram, zram and device-mapper devices
// are never install targets.
func IsVirtualDisk(name string) bool {
	for _, p := range []string{"loop", "ram", "zram", "dm-", "md", "nbd"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// ProbeFS reads a device's first blocks and recognises the filesystems machined meets:
// ext2/3/4 and xfs (STATE, EPHEMERAL), vfat and iso9660 (config drives). It returns the
// mount type and label, or "" for none.
func ProbeFS(path string) (fstype, label string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	buf := make([]byte, 34*1024)
	n, _ := f.ReadAt(buf, 0)
	return probeFSBytes(buf[:n])
}

func probeFSBytes(b []byte) (string, string, error) {
	cstr := func(p []byte) string { return strings.TrimRight(string(bytes.TrimRight(p, "\x00")), " ") }
	switch {
	case len(b) >= 1024+136 && binary.LittleEndian.Uint16(b[1024+56:]) == 0xEF53:
		return "ext4", cstr(b[1024+120 : 1024+136]), nil
	case len(b) >= 120 && string(b[0:4]) == "XFSB":
		return "xfs", cstr(b[108:120]), nil
	case len(b) >= 32768+72 && string(b[32769:32774]) == "CD001":
		return "iso9660", cstr(b[32768+40 : 32768+72]), nil
	case len(b) >= 512 && b[510] == 0x55 && b[511] == 0xAA && string(b[82:87]) == "FAT32":
		return "vfat", cstr(b[71:82]), nil
	case len(b) >= 512 && b[510] == 0x55 && b[511] == 0xAA && (string(b[54:59]) == "FAT12" || string(b[54:59]) == "FAT16"):
		return "vfat", cstr(b[43:54]), nil
	case len(b) >= 4 && string(b[0:4]) == "hsqs":
		return "squashfs", "", nil
	}
	return "", "", nil
}

// IsBlank says whether a disk is blank: nothing but zeros in the first and last MiB, where
// partition tables and filesystems keep their magic (an mdraid 0.90 or 1.0 superblock and a
// backup GPT sit at the end), and no signature machined's probe knows (probe.go; LUKS2's
// secondary headers reach past the first MiB). That is how a freshly provisioned virtual or
// wiped disk reads.
func IsBlank(path string) bool {
	w, err := readWindowsAt(path)
	if err != nil {
		return false
	}
	return len(nonZero(w)) == 0 && len(ProbeSignatures(w)) == 0
}
