package disk

// What `machined install` looks for before it overwrites a disk, and what makes it refuse
// even with --wipe.
//
// A disk counts as empty only when machined's own probe finds no signature, blkid's library
// (through wipefs, else blkid, where either is installed) finds none, and its first and last
// MiB are all zeros. machined's probe exists because the installer container holds nothing
// but machined: no util-linux there. Where util-linux is there too, both run, so a signature
// either one knows is enough to refuse.
//
// A disk in use (a partition mounted, used as swap, held by device-mapper or md, or claimed
// exclusively by anyone) is refused even with --wipe: that is a running system's data.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kiln/machined/internal/safego"
	"kiln/machined/internal/supervisor"
)

// probeWindow is how much of each end of a disk is read, and what must be zero there.
const probeWindow = 1 << 20

// Finding is one thing found on a disk: what a person reads ("an LVM2 physical volume"),
// blkid's name for it (ID: "LVM2_member"; "" when blkid has none) and where it starts.
type Finding struct {
	what   string
	ID     string
	offset int64
}

// String is the finding in words, with blkid's name for it in brackets when it has one.
func (f Finding) String() string {
	if f.ID == "" {
		return f.what
	}
	return f.what + " (" + f.ID + ")"
}

// knownTypes names blkid's types in words; others read "a <type> signature".
var knownTypes = map[string]string{
	"LVM2_member":       "an LVM2 physical volume",
	"linux_raid_member": "an mdraid array member",
	"ntfs":              "an NTFS filesystem",
	"exfat":             "an exFAT filesystem",
	"BitLocker":         "a BitLocker volume",
	"f2fs":              "an F2FS filesystem",
	"ceph_bluestore":    "a Ceph BlueStore device",
	"ext2":              "an ext2 filesystem",
	"ext3":              "an ext3 filesystem",
	"ext4":              "an ext4 filesystem",
	"xfs":               "an XFS filesystem",
	"btrfs":             "a btrfs filesystem",
	"swap":              "swap space",
	"iso9660":           "an ISO 9660 filesystem",
	"crypto_LUKS":       "a LUKS volume",
	"vfat":              "a FAT filesystem",
	"squashfs":          "a squashfs filesystem",
	"dos":               "an MBR partition table",
	"PMBR":              "a protective MBR",
}

func typedFinding(id string, offset int64) Finding {
	what, ok := knownTypes[id]
	if !ok {
		what = "a " + id + " signature"
	}
	return Finding{what, id, offset}
}

// gptFinding: the header at LBA 1 is the table; one elsewhere (the last LBA) its backup.
func gptFinding(offset int64) Finding {
	if offset == 512 || offset == 4096 {
		return Finding{"a GPT partition table", "gpt", offset}
	}
	return Finding{"a backup GPT header", "gpt", offset}
}

// Windows is a disk's first and last probeWindow bytes (fewer on a smaller disk) and
// its size; the probes below read nothing else.
type Windows struct {
	head, tail []byte
	size       int64
	// at reads n bytes at an absolute offset beyond the windows (LUKS2's secondary headers)
	at func(off int64, n int) []byte
}

// ReadWindows reads the windows of a disk (or image) of the given size.
func ReadWindows(r io.ReaderAt, size int64) (*Windows, error) {
	read := func(off int64, n int) ([]byte, error) {
		if off < 0 || off >= size {
			return nil, nil
		}
		if int64(n) > size-off {
			n = int(size - off)
		}
		b := make([]byte, n)
		got, err := r.ReadAt(b, off)
		if err != nil && !(errors.Is(err, io.EOF) && got == n) {
			return nil, err
		}
		return b, nil
	}
	w := &Windows{size: size}
	var err error
	if w.head, err = read(0, probeWindow); err != nil {
		return nil, err
	}
	tailStart := size - probeWindow
	if tailStart < 0 {
		tailStart = 0
	}
	if w.tail, err = read(tailStart, int(size-tailStart)); err != nil {
		return nil, err
	}
	w.at = func(off int64, n int) []byte { b, _ := read(off, n); return b }
	return w, nil
}

// bytesAt returns n bytes at an absolute offset from whichever window holds them, else nil.
func (w *Windows) bytesAt(off int64, n int) []byte {
	if off < 0 || off+int64(n) > w.size {
		return nil
	}
	if off+int64(n) <= int64(len(w.head)) {
		return w.head[off : off+int64(n)]
	}
	if start := w.size - int64(len(w.tail)); off >= start {
		return w.tail[off-start : off-start+int64(n)]
	}
	if w.at != nil {
		return w.at(off, n)
	}
	return nil
}

func (w *Windows) is(off int64, magic string) bool {
	return string(w.bytesAt(off, len(magic))) == magic
}

func (w *Windows) le32(off int64) (uint32, bool) {
	b := w.bytesAt(off, 4)
	if b == nil {
		return 0, false
	}
	return binary.LittleEndian.Uint32(b), true
}

const mdMagic = 0xa92b4efc

// readWindowsAt reads the windows of the disk or image at path, sized by seeking to its end
// (which a block device answers, where its stat says 0); an empty one is an error.
func readWindowsAt(path string) (*Windows, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return ReadWindows(f, size)
}

// ProbePath is ProbeSignatures on the disk or image at path.
func ProbePath(path string) ([]Finding, error) {
	w, err := readWindowsAt(path)
	if err != nil {
		return nil, err
	}
	return ProbeSignatures(w), nil
}

// ProbeSignatures is machined's own probe: the signatures the kernel's and blkid's probes
// use for what people most often find on a disk they did not mean to erase. It returns
// them in the order of their offsets.
func ProbeSignatures(w *Windows) []Finding {
	var out []Finding
	add := func(f Finding) { out = append(out, f) }
	for sector := int64(0); sector < 4; sector++ { // LVM2's label lives in one of sectors 0-3
		if off := sector * 512; w.is(off, "LABELONE") && w.is(off+24, "LVM2 001") {
			add(typedFinding("LVM2_member", off))
		}
	}
	// mdraid 1.1 at 0, 1.2 at 4 KiB, 1.0 8-12 KiB before the end (4 KiB aligned)
	for _, off := range []int64{0, 4096, ((w.size>>9 - 16) &^ 7) << 9} {
		if m, ok := w.le32(off); ok && off >= 0 && m == mdMagic {
			if v, _ := w.le32(off + 4); v == 1 {
				add(Finding{"an mdraid array member (metadata 1.x)", "linux_raid_member", off})
			}
		}
	}
	if off := w.size&^(64<<10-1) - 64<<10; off >= 0 { // 0.90: in the last 64 KiB-aligned 64 KiB, host order
		if b := w.bytesAt(off, 4); b != nil && (binary.LittleEndian.Uint32(b) == mdMagic || binary.BigEndian.Uint32(b) == mdMagic) {
			add(Finding{"an mdraid array member (metadata 0.90)", "linux_raid_member", off})
		}
	}
	switch {
	case w.is(3, "NTFS    "):
		add(typedFinding("ntfs", 3))
	case w.is(3, "EXFAT   "):
		add(typedFinding("exfat", 3))
	case w.is(3, "-FVE-FS-"):
		add(typedFinding("BitLocker", 3))
	}
	if m, ok := w.le32(1024); ok && m == 0xF2F52010 {
		add(typedFinding("f2fs", 1024))
	}
	if w.is(0, "bluestore block device") {
		add(typedFinding("ceph_bluestore", 0))
	}
	if b := w.bytesAt(1024, 128); b != nil && binary.LittleEndian.Uint16(b[56:]) == 0xEF53 {
		add(typedFinding(extVersion(b), 1080))
	}
	if w.is(0, "XFSB") {
		add(typedFinding("xfs", 0))
	}
	if w.is(0x10040, "_BHRfS_M") {
		add(typedFinding("btrfs", 0x10040))
	}
	for _, page := range []int64{4096, 8192, 16384, 65536} {
		if w.is(page-10, "SWAPSPACE2") || w.is(page-10, "SWAP-SPACE") {
			add(typedFinding("swap", page-10))
			break
		}
	}
	if w.is(32769, "CD001") {
		add(typedFinding("iso9660", 32769))
	}
	if w.is(0, "LUKS\xba\xbe") {
		add(typedFinding("crypto_LUKS", 0))
	} else {
		for off := int64(16 << 10); off <= 4<<20; off *= 2 { // LUKS2's secondary header alone
			if w.is(off, "SKUL\xba\xbe") {
				add(typedFinding("crypto_LUKS", off))
				break
			}
		}
	}
	if w.is(0, "hsqs") {
		add(typedFinding("squashfs", 0))
	}
	if fs, _, _ := probeFSBytes(w.head); fs == "vfat" {
		add(typedFinding("vfat", 0))
	}
	for _, off := range []int64{512, 4096, w.size - 512, w.size - 4096} {
		if off > 0 && w.is(off, "EFI PART") {
			add(gptFinding(off))
		}
	}
	out = append(out, mbrFindings(w.head, out)...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].offset < out[j].offset })
	return out
}

// extVersion names an ext superblock the way blkid does: ext4 with features ext3 lacks,
// ext3 with a journal, else ext2.
func extVersion(sb []byte) string {
	compat := binary.LittleEndian.Uint32(sb[92:])
	incompat := binary.LittleEndian.Uint32(sb[96:])
	roCompat := binary.LittleEndian.Uint32(sb[100:])
	const ext3Incompat = 0x2 | 0x4 | 0x8 | 0x10 // filetype, recover, journal_dev, meta_bg
	const ext3RoCompat = 0x1 | 0x2 | 0x4        // sparse_super, large_file, btree_dir
	switch {
	case incompat&^ext3Incompat != 0 || roCompat&^ext3RoCompat != 0:
		return "ext4"
	case compat&0x4 != 0:
		return "ext3"
	}
	return "ext2"
}

// mbrFindings reads the boot signature at 510: an MBR with partitions, a protective MBR,
// or just the signature (which a FAT, NTFS or exFAT boot sector, already found, explains).
func mbrFindings(head []byte, found []Finding) []Finding {
	if len(head) < 512 || head[510] != 0x55 || head[511] != 0xAA {
		return nil
	}
	for _, f := range found {
		if f.offset <= 3 && (f.ID == "vfat" || f.ID == "ntfs" || f.ID == "exfat" || f.ID == "BitLocker") {
			return nil
		}
	}
	protective, entries := false, false
	for i := 0; i < 4; i++ {
		switch head[446+16*i+4] {
		case 0:
		case 0xEE:
			protective = true
		default:
			entries = true
		}
	}
	switch {
	case entries:
		return []Finding{typedFinding("dos", 510)}
	case protective:
		return []Finding{typedFinding("PMBR", 510)}
	}
	return []Finding{{"an MBR boot signature (0x55AA at byte 510)", "", 510}}
}

// nonZero names the disk's ends that hold anything but zeros.
func nonZero(w *Windows) []Finding {
	var out []Finding
	if bytes.IndexFunc(w.head, func(r rune) bool { return r != 0 }) >= 0 {
		out = append(out, Finding{"data in its first MiB", "", 0})
	}
	if bytes.IndexFunc(w.tail, func(r rune) bool { return r != 0 }) >= 0 {
		out = append(out, Finding{"data in its last MiB", "", w.size - int64(len(w.tail))})
	}
	return out
}

// ToolDirs are searched after PATH (machined as PID 1 has none); blkid is /usr/sbin/blkid
// on a Kiln rootfs.
var ToolDirs = []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"}

// LookTool finds a tool in PATH, then in ToolDirs; "" when it is in neither.
func LookTool(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, d := range ToolDirs {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// probeWithUtilLinux asks libblkid through wipefs (every signature, with offsets) or, where
// only blkid is installed (a Kiln rootfs), `blkid -p` (one result, or "ambivalent" for
// several). It returns the findings and the tool used ("" when neither is installed).
func probeWithUtilLinux(disk string) ([]Finding, string, error) {
	if wipefs := LookTool("wipefs"); wipefs != "" {
		out, err := runProbeTool(wipefs, "--no-act", "--json", disk)
		if err != nil {
			return nil, "wipefs", err
		}
		found, err := parseWipefsJSON(out)
		return found, "wipefs", err
	}
	if blkid := LookTool("blkid"); blkid != "" {
		out, err := runProbeTool(blkid, "--probe", "--output", "export", disk)
		var pe *probeExit
		switch {
		case errors.As(err, &pe) && pe.code == 2: // nothing found
			return nil, "blkid", nil
		case errors.As(err, &pe): // 8: several signatures
			return []Finding{{"several signatures (blkid: ambivalent result)", "", 0}}, "blkid", nil
		case err != nil:
			return nil, "blkid", err
		}
		return parseBlkidExport(out), "blkid", nil
	}
	return nil, "", nil
}

// runProbeTool runs a probe through machined's reaper (as PID 1 it reaps every child, so
// exec.Cmd.Wait would race it), with stdout and stderr apart (wipefs's JSON must not mix
// with its warnings), bounded in time and size. Exit statuses 2 and 8 come back as
// *probeExit with the output: blkid's "nothing found" and "ambivalent".
func runProbeTool(path string, args ...string) ([]byte, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = supervisor.BaseEnv()
	cmd.Stdout, cmd.Stderr = outW, errW
	done, err := supervisor.Children().Start(cmd)
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, err
	}
	timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	stderr := make(chan []byte, 1)
	safego.Go("probe stderr", func() {
		var b []byte
		defer func() { stderr <- b }() // even after a panic, so the probe never waits forever
		b, _ = io.ReadAll(io.LimitReader(errR, 64<<10))
		_, _ = io.Copy(io.Discard, errR)
		errR.Close()
	})
	out, _ := io.ReadAll(io.LimitReader(outR, 4<<20))
	_, _ = io.Copy(io.Discard, outR)
	outR.Close()
	status := <-done
	msg := strings.TrimSpace(strings.SplitN(string(<-stderr), "\n", 2)[0])
	switch {
	case status.Exited() && status.ExitStatus() == 0:
		return out, nil
	case status.Exited() && (status.ExitStatus() == 2 || status.ExitStatus() == 8):
		return out, &probeExit{status.ExitStatus()}
	}
	return nil, fmt.Errorf("%s: %s: %s", filepath.Base(path), supervisor.DescribeExit(status), msg)
}

type probeExit struct{ code int }

func (e *probeExit) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func parseWipefsJSON(out []byte) ([]Finding, error) {
	var doc struct {
		Signatures []struct {
			Offset string `json:"offset"`
			Type   string `json:"type"`
		} `json:"signatures"`
	}
	if len(bytes.TrimSpace(out)) == 0 {
		return nil, nil // older wipefs print nothing for nothing
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("wipefs: unreadable JSON: %v", err)
	}
	var found []Finding
	for _, s := range doc.Signatures {
		off, _ := strconv.ParseInt(s.Offset, 0, 64)
		if s.Type == "gpt" {
			found = append(found, gptFinding(off))
			continue
		}
		found = append(found, typedFinding(s.Type, off))
	}
	return found, nil
}

func parseBlkidExport(out []byte) []Finding {
	var found []Finding
	for _, line := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "TYPE":
			found = append(found, typedFinding(v, 0))
		case "PTTYPE":
			if v == "gpt" {
				found = append(found, gptFinding(512))
			} else {
				found = append(found, typedFinding(v, 0))
			}
		}
	}
	return found
}

// mergeFindings keeps the first finding of each kind (blkid's type; for GPT, table or backup
// header; else the words), so machined's more precise words win over util-linux's for the
// same signature, and drops what another implies: a GPT implies its backup header and
// protective MBR, an MBR table its boot signature.
func mergeFindings(lists ...[]Finding) []Finding {
	seen := map[string]bool{}
	var all []Finding
	for _, l := range lists {
		for _, f := range l {
			key := f.ID
			if key == "" || key == "gpt" {
				key = f.what
			}
			if !seen[key] {
				seen[key] = true
				seen[f.what] = true
				all = append(all, f)
			}
		}
	}
	var out []Finding
	for _, f := range all {
		switch {
		case seen["a GPT partition table"] && (f.what == "a backup GPT header" || f.ID == "PMBR"):
		case seen["an MBR partition table"] && strings.HasPrefix(f.what, "an MBR boot signature"):
		case strings.HasPrefix(f.what, "data in its") && len(out) > 0:
			// data at an end is only news when nothing above explains it
		default:
			out = append(out, f)
		}
	}
	return out
}

// JoinFindings names findings in a sentence: "a, b and c".
func JoinFindings(found []Finding) string {
	parts := make([]string, len(found))
	for i, f := range found {
		parts[i] = f.String()
	}
	if len(parts) <= 1 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// Content is everything found on the open disk: machined's probe, util-linux's where
// installed, and non-zero ends. tools names the probes that ran.
func Content(f *os.File, path string, size int64) (found []Finding, tools []string, err error) {
	w, err := ReadWindows(f, size)
	if err != nil {
		return nil, nil, err
	}
	own := ProbeSignatures(w)
	tools = []string{"machined's probe"}
	ul, tool, err := probeWithUtilLinux(path)
	if err != nil {
		return nil, nil, err
	}
	if tool != "" {
		tools = append(tools, tool)
	}
	return mergeFindings(own, ul, nonZero(w)), tools, nil
}

// --- in use ------------------------------------------------------------------------------

// Users names what uses a block device or any of its partitions: mounts (by major:minor
// in mountinfo, and by source path), swap, and holders (device-mapper, md). sysRoot and
// procRoot are /sys and /proc (fake trees in tests). It misses what only O_EXCL sees (a
// mount in another mount namespace, a process holding it open exclusively), so the caller
// opens with O_EXCL as well.
func Users(sysRoot, procRoot, disk string, rdev uint64) []string {
	devs := map[string]string{devKey(rdev): disk} // "maj:min" -> a name people know
	sysDir := filepath.Join(sysRoot, "dev", "block", devKey(rdev))
	entries, _ := os.ReadDir(sysDir)
	dirs := []string{sysDir}
	for _, e := range entries {
		dir := filepath.Join(sysDir, e.Name())
		if exists(filepath.Join(dir, "partition")) {
			key := strings.TrimSpace(readSysString(filepath.Join(dir, "dev")))
			if key != "" {
				devs[key] = "/dev/" + e.Name()
			}
			dirs = append(dirs, dir)
		}
	}
	var users []string
	users = append(users, mountUsers(filepath.Join(procRoot, "self", "mountinfo"), devs)...)
	users = append(users, swapUsers(filepath.Join(procRoot, "swaps"), devs)...)
	for _, dir := range dirs {
		holders, _ := os.ReadDir(filepath.Join(dir, "holders"))
		name := devs[strings.TrimSpace(readSysString(filepath.Join(dir, "dev")))]
		if dir == sysDir {
			name = disk
		}
		for _, h := range holders {
			users = append(users, name+" is held by "+holderName(sysRoot, h.Name()))
		}
	}
	return users
}

func devKey(rdev uint64) string {
	// Linux's encoding of dev_t (glibc's gnu_dev_major/minor)
	major := (rdev>>8)&0xfff | (rdev>>32)&^0xfff
	minor := rdev&0xff | (rdev>>12)&^0xff
	return fmt.Sprintf("%d:%d", major, minor)
}

func readSysString(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// holderName: "dm-0 (device-mapper vg-lv)", "md127 (md array)", else the kernel's name.
func holderName(sysRoot, name string) string {
	if dm := strings.TrimSpace(readSysString(filepath.Join(sysRoot, "class", "block", name, "dm", "name"))); dm != "" {
		return name + " (device-mapper " + dm + ")"
	}
	if strings.HasPrefix(name, "md") {
		return name + " (md array)"
	}
	return name
}

func mountUsers(mountinfo string, devs map[string]string) []string {
	var users []string
	for _, line := range strings.Split(readSysString(mountinfo), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 2 {
			continue
		}
		name, ok := devs[fields[2]]
		if !ok {
			name, ok = devByPath(UnescapeProcField(tail[1]), devs)
		}
		if ok {
			users = append(users, name+" is mounted at "+UnescapeProcField(fields[4]))
		}
	}
	return users
}

func swapUsers(swaps string, devs map[string]string) []string {
	var users []string
	for i, line := range strings.Split(readSysString(swaps), "\n") {
		fields := strings.Fields(line)
		if i == 0 || len(fields) == 0 {
			continue // the header
		}
		if name, ok := devByPath(UnescapeProcField(fields[0]), devs); ok {
			users = append(users, name+" is in use as swap")
		}
	}
	return users
}

// devByPath: the device a path names, when it is one of devs.
func devByPath(path string, devs map[string]string) (string, bool) {
	if !strings.HasPrefix(path, "/") {
		return "", false
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFBLK {
		return "", false
	}
	name, ok := devs[devKey(uint64(st.Rdev))]
	return name, ok
}

// UnescapeProcField undoes the kernel's octal escapes (\040 for a space) in mountinfo and swaps.
func UnescapeProcField(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
