// Package testkit holds what machined's tests in several packages share: disk images with
// stubbed signatures and GPT images made by the real sfdisk, a supervisor with fast backoff,
// fake files, a fake server's queued replies, and logs safe to write from any goroutine. Only tests import it; the tests of
// the packages it imports itself use internal/testkit/wait.
package testkit

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"kiln/machined/internal/supervisor"
)

// SignatureStub is where a tool writes its signature and what the probe calls it.
type SignatureStub struct {
	Patches map[int64][]byte
	Want    string
}

// ProbeDiskSize is the size of the images StubDisk writes.
const ProbeDiskSize = 16 << 20

// MDMagic is an md superblock's magic.
const MDMagic = 0xa92b4efc

// StubDisk writes a ProbeDiskSize image of zeros with each patch's bytes at its offset
// (negative offsets count from the end).
func StubDisk(t *testing.T, path string, patches map[int64][]byte) {
	t.Helper()
	b := make([]byte, ProbeDiskSize)
	for off, data := range patches {
		if off < 0 {
			off += ProbeDiskSize
		}
		copy(b[off:], data)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// PutLE32 is v as 4 little-endian bytes.
func PutLE32(v uint32) []byte {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, v)
	return b
}

// MDSuper is the magic and major_version 1 of an md 1.x superblock.
func MDSuper() []byte { return append(PutLE32(MDMagic), PutLE32(1)...) }

// SignatureStubs are the bytes each signature's tool writes, at the offsets it writes them
// (the magic only: enough for machined's probe; blkid also checks checksums and may not
// recognise a stub, which is why the real tools are tested as well).
var SignatureStubs = map[string]SignatureStub{
	"LVM2 PV (sector 1)":   {map[int64][]byte{512: []byte("LABELONE"), 512 + 24: []byte("LVM2 001")}, "an LVM2 physical volume (LVM2_member)"},
	"LVM2 PV (sector 3)":   {map[int64][]byte{1536: []byte("LABELONE"), 1536 + 24: []byte("LVM2 001")}, "an LVM2 physical volume (LVM2_member)"},
	"mdraid 1.1":           {map[int64][]byte{0: MDSuper()}, "an mdraid array member (metadata 1.x) (linux_raid_member)"},
	"mdraid 1.2":           {map[int64][]byte{4096: MDSuper()}, "an mdraid array member (metadata 1.x) (linux_raid_member)"},
	"mdraid 1.0":           {map[int64][]byte{-8192: MDSuper()}, "an mdraid array member (metadata 1.x) (linux_raid_member)"},
	"mdraid 0.90":          {map[int64][]byte{-65536: PutLE32(MDMagic)}, "an mdraid array member (metadata 0.90) (linux_raid_member)"},
	"NTFS":                 {map[int64][]byte{3: []byte("NTFS    "), 510: {0x55, 0xAA}}, "an NTFS filesystem (ntfs)"},
	"exFAT":                {map[int64][]byte{3: []byte("EXFAT   "), 510: {0x55, 0xAA}}, "an exFAT filesystem (exfat)"},
	"BitLocker":            {map[int64][]byte{3: []byte("-FVE-FS-"), 510: {0x55, 0xAA}}, "a BitLocker volume (BitLocker)"},
	"F2FS":                 {map[int64][]byte{1024: PutLE32(0xF2F52010)}, "an F2FS filesystem (f2fs)"},
	"Ceph bluestore":       {map[int64][]byte{0: []byte("bluestore block device\n")}, "a Ceph BlueStore device (ceph_bluestore)"},
	"ext2":                 {map[int64][]byte{1080: {0x53, 0xEF}}, "an ext2 filesystem (ext2)"},
	"xfs":                  {map[int64][]byte{0: []byte("XFSB")}, "an XFS filesystem (xfs)"},
	"btrfs":                {map[int64][]byte{65600: []byte("_BHRfS_M")}, "a btrfs filesystem (btrfs)"},
	"swap":                 {map[int64][]byte{4086: []byte("SWAPSPACE2")}, "swap space (swap)"},
	"iso9660":              {map[int64][]byte{32769: []byte("CD001")}, "an ISO 9660 filesystem (iso9660)"},
	"LUKS":                 {map[int64][]byte{0: []byte("LUKS\xba\xbe")}, "a LUKS volume (crypto_LUKS)"},
	"vfat":                 {map[int64][]byte{82: []byte("FAT32"), 510: {0x55, 0xAA}}, "a FAT filesystem (vfat)"},
	"GPT primary":          {map[int64][]byte{512: []byte("EFI PART")}, "a GPT partition table (gpt)"},
	"GPT backup only":      {map[int64][]byte{-512: []byte("EFI PART")}, "a backup GPT header (gpt)"},
	"MBR with a partition": {map[int64][]byte{446 + 4: {0x83}, 510: {0x55, 0xAA}}, "an MBR partition table (dos)"},
	"MBR signature only":   {map[int64][]byte{510: {0x55, 0xAA}}, "an MBR boot signature (0x55AA at byte 510)"},
}

// GPTImage makes a sized file with a GPT from the real sfdisk and recognisable bytes in
// its first partition (the image's "content": tests check they arrive intact).
func GPTImage(t *testing.T, dir string, size int64) string {
	t.Helper()
	sf, err := exec.LookPath("sfdisk")
	if err != nil {
		t.Skip("sfdisk not installed (Debian: fdisk)")
	}
	path := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	script := "label: gpt\nstart=2048, size=2048, name=EFI\nsize=2048, name=BOOT\n"
	// through machined's reaper: once a test has started it, it reaps every child
	if out, err := supervisor.RunInput([]byte(script), sf, "--quiet", path); err != nil {
		t.Fatalf("sfdisk: %v\n%s", err, out)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte("kiln"), 1024), 2048*512); err != nil {
		t.Fatal(err)
	}
	return path
}
