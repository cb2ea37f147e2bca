package main

// `machined install --upgrade` is the new version's half of an upgrade. The running
// machined pulls the installer image, unpacks it and runs this in an isolated root that
// holds only the image's files and the owned disk's device nodes. It writes the image's
// kernel and initramfs into the slot that is not running, with the command line from the
// image's release.json, and puts that slot on trial in the boot state. Nothing it writes
// is booted unless the boot state says so, and that is written last.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"

	"kiln/machined/internal/bootstate"
	"kiln/machined/internal/persist"
	"kiln/machined/internal/safefile"
)

const (
	releaseDir       = "/usr/share/kiln"
	defaultTries     = 3
	releaseMax       = 64 << 10
	upgradeBootMount = "/boot"
)

// release is release.json in the installer image (written by kiln.image.outputs.installer).
type release struct {
	Version      string `json:"version"`
	Architecture string `json:"architecture"`
	Cmdline      string `json:"cmdline"`
}

var (
	versionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}$`)
	cmdlineRE = regexp.MustCompile(`^[\x20-\x7e]*$`)
	// a word GRUB's script reads as itself, unquoted
	grubPlainRE = regexp.MustCompile(`^[A-Za-z0-9._,:=/+@%~-]+$`)
)

// grubCmdline turns a kernel command line into the arguments of GRUB's `linux` command: each
// space-separated word as it is when GRUB's script reads it as itself, else in single quotes, so
// no character ($, ;, &, |, {, }, #, ", <, >, a newline...) can end the command or expand. GRUB
// passes its arguments on joined by spaces, so the kernel gets the line it was given (runs of
// spaces become one). What single quotes cannot hold is refused: a ' or a \, a character that
// is not printable ASCII, and kiln.slot= (GRUB's boot.cfg names the slot itself).
func grubCmdline(cmdline string) (string, error) {
	if len(cmdline) > 2048 || !cmdlineRE.MatchString(cmdline) || strings.Contains(cmdline, "kiln.slot=") {
		return "", errors.New("the kernel command line must be one printable line of at most 2048 bytes without kiln.slot=")
	}
	words := strings.Fields(cmdline)
	for i, w := range words {
		if grubPlainRE.MatchString(w) {
			continue
		}
		if strings.ContainsAny(w, `'\`) {
			return "", fmt.Errorf("the kernel command line's word %q holds a ' or a \\, which GRUB's boot.cfg cannot quote", w)
		}
		words[i] = "'" + w + "'"
	}
	return strings.Join(words, " "), nil
}

// readRelease reads and checks release.json, the file rel under root, following no link on the
// way (machined reads it from a pulled image): it ends up in GRUB's boot.cfg, so it must be one
// printable line with no slot of its own.
func readRelease(root, rel string) (release, error) {
	var r release
	data, err := safefile.ReadUnder(root, rel, releaseMax)
	if err != nil {
		return r, refuse("release: %v", unwrapPath(err))
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, refuse("release.json: %v", err)
	}
	switch {
	case !versionRE.MatchString(r.Version):
		return r, refuse("release.json: version %q is not a version", r.Version)
	case r.Architecture != runtime.GOARCH:
		return r, refuse("release.json: the image is for %q, this machine is %s", r.Architecture, runtime.GOARCH)
	}
	if _, err := grubCmdline(r.Cmdline); err != nil {
		return r, refuse("release.json: %v", err)
	}
	return r, nil
}

// upgradeMain is `machined install --upgrade --boot DEV --slot A|B [--tries N]`.
func upgradeMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("machined install --upgrade", flag.ContinueOnError)
	fs.SetOutput(stderr)
	boot := fs.String("boot", "", "the BOOT partition holding the slots (required)")
	slot := fs.String("slot", "", "the slot to write: the one that is not running (required)")
	tries := fs.Int("tries", defaultTries, "boots the new slot gets to reach ready before GRUB falls back")
	dir := fs.String("release", releaseDir, "where the image's vmlinuz, initramfs.zst and release.json are")
	bootDir := fs.String("boot-dir", "", "BOOT, already mounted here (instead of --boot: what an upgrade's sandbox gives)")
	pause := fs.String("test-pause-after", "", "end-to-end power-cut tests: stop for good after this step (kiln.test=pause:STEP)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if (*boot == "") == (*bootDir == "") || !bootstate.Valid(*slot) || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "install: --upgrade needs --boot DEVICE or --boot-dir DIR, and --slot A or B, and nothing else")
		return 2
	}
	say := installSay(stdout)
	if *pause != "" {
		upgradeCheckpoint = func(step string) { pauseAt(*pause, step, say) }
	}
	if *bootDir != "" {
		return exitCode(writeSlotInto(*dir, *bootDir, *slot, *tries, say), stderr)
	}
	return exitCode(writeSlot(*dir, *boot, *slot, *tries, say), stderr)
}

// writeSlot mounts BOOT (in the installer's own mount namespace) and writes the slot.
func writeSlot(dir, boot, slot string, tries int, say func(string, ...interface{})) error {
	if err := os.MkdirAll(upgradeBootMount, 0o700); err != nil {
		return failed("%v", err)
	}
	if err := syscall.Mount(boot, upgradeBootMount, "vfat", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, "umask=077"); err != nil {
		return refuse("mount BOOT %s: %v", boot, err)
	}
	defer syscall.Unmount(upgradeBootMount, 0)
	return writeSlotInto(dir, upgradeBootMount, slot, tries, say)
}

// upgradeCheckpoint is called after each step that changes BOOT; the power-cut tests stop the
// write there and check that what is on BOOT still boots (the Go tests set it, and
// --test-pause-after for the end-to-end ones).
var upgradeCheckpoint = func(step string) {}

// pauseAt blocks its goroutine for good when step is `want` (spaces written as '-'), after saying
// so: an end-to-end test cuts the power (kills QEMU) there. Any other step returns at once.
func pauseAt(want, step string, say func(string, ...interface{})) {
	if want == "" || want != strings.ReplaceAll(step, " ", "-") {
		return
	}
	say("test: paused after %s, for a power cut", step)
	for {
		time.Sleep(time.Hour) // not select{}: with nothing else running, Go would call that a deadlock
	}
}

// writeSlotInto writes the slot into a mounted BOOT, then the boot state that puts it on trial.
// Until that last write, GRUB boots the default slot, which nothing here touches; so a power cut
// at any step leaves a disk that boots the old release or, after it, the new one on trial.
func writeSlotInto(dir, bootDir, slot string, tries int, say func(string, ...interface{})) error {
	rel, err := readRelease(dir, "release.json")
	if err != nil {
		return err
	}
	files := map[string]string{"vmlinuz": filepath.Join(dir, "vmlinuz"), "initramfs.zst": filepath.Join(dir, "initramfs.zst")}
	for _, path := range files {
		if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() || st.Size() == 0 {
			return refuse("the image has no %s", path)
		}
	}
	env := filepath.Join(bootDir, "grub", "grubenv")
	st, err := bootstate.Read(env)
	if err != nil {
		return refuse("%s holds no boot state Kiln can read: %v", bootDir, err)
	}
	if st.Default == slot {
		// the default slot is what GRUB falls back to: overwriting it could strand the machine
		return refuse("slot %s is the default; boot the default slot (the other one) before upgrading", slot)
	}
	uki := filepath.Join(dir, slot+".efi")
	signed := regularFile(uki)
	if !signed && regularFile(filepath.Join(bootDir, st.Default, ukiName)) {
		// the disk boots signed UKIs through shim and GRUB: a bare kernel would fail verification
		return refuse("this disk boots signed UKIs (Secure Boot) and the image has none for slot %s: build it with secureboot", slot)
	}
	say("writing slot %s: Kiln %s", slot, rel.Version)
	target := filepath.Join(bootDir, slot)
	// what the slot held goes first: BOOT has room for two slots, not three
	for _, name := range []string{"boot.cfg", "vmlinuz", "initramfs.zst", ukiName} {
		if err := os.Remove(filepath.Join(target, name)); err != nil && !os.IsNotExist(err) {
			return failed("clearing slot %s: %v", slot, err)
		}
		upgradeCheckpoint("removed " + slot + "/" + name)
	}
	if err := os.MkdirAll(target, 0o755); err != nil {
		return failed("slot %s: %v", slot, err)
	}
	cfg, err := writeSlotFiles(dir, target, slot, rel, signed, say)
	if err != nil {
		return err
	}
	if err := persist.WriteFileAtomic(filepath.Join(target, "boot.cfg"), []byte(cfg), 0o644); err != nil {
		return failed("writing slot %s: %v", slot, err)
	}
	upgradeCheckpoint("wrote " + slot + "/boot.cfg")
	if err := st.Try(slot, rel.Version, tries); err != nil {
		return refuse("%v", err)
	}
	if err := bootstate.Write(env, st); err != nil {
		return failed("%v", err)
	}
	syscall.Sync()
	upgradeCheckpoint("wrote the boot state")
	say("slot %s is on trial for %d boots; slot %s stays the default until it reaches ready", slot, tries, st.Default)
	return nil
}

// ukiName is a Secure Boot slot's signed UKI (kernel, initramfs and command line in one PE file).
const ukiName = "kiln.efi"

// writeSlotFiles copies the slot's boot files and returns its boot.cfg: the kernel and initramfs
// with release.json's command line, or, for a Secure Boot release, the image's signed UKI for this
// slot (<slot>.efi, whose command line already names the slot), which GRUB chainloads through shim.
func writeSlotFiles(dir, target, slot string, rel release, signed bool, say func(string, ...interface{})) (string, error) {
	names := map[string]string{"vmlinuz": "vmlinuz", "initramfs.zst": "initramfs.zst"}
	if signed {
		names = map[string]string{slot + ".efi": ukiName}
	}
	for from, to := range names {
		n, err := copyFileSynced(filepath.Join(dir, from), filepath.Join(target, to))
		if err != nil {
			return "", failed("writing slot %s: %v", slot, err)
		}
		say("%s: %d MiB", to, n>>20)
		upgradeCheckpoint("wrote " + slot + "/" + to)
	}
	if signed {
		return fmt.Sprintf("chainloader /%s/%s\n", slot, ukiName), nil
	}
	args, err := grubCmdline(rel.Cmdline)
	if err != nil {
		return "", refuse("release.json: %v", err)
	}
	return fmt.Sprintf("linux /%s/vmlinuz %s kiln.slot=%s\ninitrd /%s/initramfs.zst\n", slot, args, slot, slot), nil
}

func regularFile(path string) bool {
	st, err := os.Lstat(path)
	return err == nil && st.Mode().IsRegular() && st.Size() > 0
}

// copyFileSynced copies src to dst through a temporary name, synced before the rename.
func copyFileSynced(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	tmp := dst + ".new"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return n, err
	}
	return n, nil
}
