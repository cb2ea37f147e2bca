package main

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"kiln/machined/internal/bootstate"
)

// newRelease is an unpacked installer image's /usr/share/kiln.
func newRelease(t *testing.T, json string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range map[string]string{"vmlinuz": "kernel v2", "initramfs.zst": "initramfs v2", "release.json": json} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// newBoot is a BOOT partition's tree as the imager writes it: slot A and the boot state.
func newBoot(t *testing.T, st bootstate.State) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"A", "grub"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "A", "vmlinuz"), []byte("kernel v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := bootstate.Write(filepath.Join(dir, "grub", "grubenv"), st); err != nil {
		t.Fatal(err)
	}
	return dir
}

func goodRelease() string {
	return `{"architecture": "` + runtime.GOARCH + `", "cmdline": "console=ttyS0 panic=1", "version": "0.2.0"}`
}

func TestWriteSlotPutsTheNewSlotOnTrialAndLeavesTheDefault(t *testing.T) {
	boot := newBoot(t, bootstate.State{Default: "A", Rollback: "B", Versions: map[string]string{"A": "0.1.0", "B": "0.0.9"}})
	// what slot B held before (an older release) is replaced whole
	if err := os.MkdirAll(filepath.Join(boot, "B"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(boot, "B", "initramfs.zst"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	var said []string
	err := writeSlotInto(newRelease(t, goodRelease()), boot, "B", 3, func(f string, a ...interface{}) { said = append(said, f) })
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"B/vmlinuz":       "kernel v2",
		"B/initramfs.zst": "initramfs v2",
		"B/boot.cfg":      "linux /B/vmlinuz console=ttyS0 panic=1 kiln.slot=B\ninitrd /B/initramfs.zst\n",
		"A/vmlinuz":       "kernel v1",
	} {
		got, err := os.ReadFile(filepath.Join(boot, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q (%v), want %q", name, got, err, want)
		}
	}
	st, err := bootstate.Read(filepath.Join(boot, "grub", "grubenv"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Default != "A" || st.Next != "B" || st.Tries != 3 || st.Rollback != "" || st.Versions["B"] != "0.2.0" || st.Versions["A"] != "0.1.0" {
		t.Fatalf("boot state after the upgrade: %+v", st)
	}
	leftovers, _ := filepath.Glob(filepath.Join(boot, "B", "*.new"))
	if len(leftovers) != 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}
	if len(said) == 0 {
		t.Fatal("no progress lines")
	}
}

func TestWriteSlotRefusesWhatWouldStrandTheMachine(t *testing.T) {
	cases := map[string]struct {
		release, slot string
		state         bootstate.State
		want          string
	}{
		"the default slot": {goodRelease(), "A", bootstate.State{Default: "A"}, "slot A is the default"},
		"another arch": {`{"architecture": "riscv64", "cmdline": "", "version": "0.2.0"}`, "B",
			bootstate.State{Default: "A"}, "the image is for \"riscv64\""},
		"a slot of its own": {`{"architecture": "` + runtime.GOARCH + `", "cmdline": "kiln.slot=A", "version": "0.2.0"}`, "B",
			bootstate.State{Default: "A"}, "without kiln.slot="},
		"a second line": {`{"architecture": "` + runtime.GOARCH + `", "cmdline": "a\ninitrd /x", "version": "0.2.0"}`, "B",
			bootstate.State{Default: "A"}, "one printable line"},
		"no version": {`{"architecture": "` + runtime.GOARCH + `", "cmdline": "", "version": "; rm"}`, "B",
			bootstate.State{Default: "A"}, "is not a version"},
		"not json": {`{`, "B", bootstate.State{Default: "A"}, "release.json"},
	}
	for name, c := range cases {
		boot := newBoot(t, c.state)
		err := writeSlotInto(newRelease(t, c.release), boot, c.slot, 3, func(string, ...interface{}) {})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", name, err, c.want)
			continue
		}
		if ie, ok := err.(*installError); !ok || ie.code != 2 {
			t.Errorf("%s: %v is not a refusal (exit 2)", name, err)
		}
		if _, err := os.Stat(filepath.Join(boot, c.slot, "boot.cfg")); err == nil && c.slot == "B" {
			t.Errorf("%s: slot B was written although refused", name)
		}
		st, _ := bootstate.Read(filepath.Join(boot, "grub", "grubenv"))
		if st.Next != "" {
			t.Errorf("%s: a refused upgrade put slot %s on trial", name, st.Next)
		}
	}
}

func TestUpgradeMainNeedsABootAndASlot(t *testing.T) {
	var out, errs strings.Builder
	if code := installMain([]string{"--upgrade", "--slot", "C"}, &out, &errs); code != 2 || !strings.Contains(errs.String(), "--boot DEVICE or --boot-dir DIR, and --slot A or B") {
		t.Fatalf("exit %d, stderr %q", code, errs.String())
	}
}

func TestWriteSlotOfASecureBootReleaseWritesItsSignedUKI(t *testing.T) {
	boot := newBoot(t, bootstate.State{Default: "A"})
	release := newRelease(t, goodRelease())
	for slot, data := range map[string]string{"A": "uki for A", "B": "uki for B"} {
		if err := os.WriteFile(filepath.Join(release, slot+".efi"), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(boot, "A", "kiln.efi"), []byte("uki v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeSlotInto(release, boot, "B", 3, func(string, ...interface{}) {}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"B/kiln.efi": "uki for B", "B/boot.cfg": "chainloader /B/kiln.efi\n"} {
		got, err := os.ReadFile(filepath.Join(boot, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q (%v), want %q", name, got, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(boot, "B", "vmlinuz")); err == nil {
		t.Error("a Secure Boot slot must not carry a bare kernel")
	}
}

func TestWriteSlotRefusesAnUnsignedReleaseOnASecureBootDisk(t *testing.T) {
	boot := newBoot(t, bootstate.State{Default: "A"})
	if err := os.WriteFile(filepath.Join(boot, "A", "kiln.efi"), []byte("uki v1"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := writeSlotInto(newRelease(t, goodRelease()), boot, "B", 3, func(string, ...interface{}) {})
	if err == nil || !strings.Contains(err.Error(), "boots signed UKIs (Secure Boot)") {
		t.Fatalf("error %v, want a refusal naming Secure Boot", err)
	}
	if _, err := os.Stat(filepath.Join(boot, "B", "boot.cfg")); err == nil {
		t.Fatal("slot B was written although refused")
	}
}

// powerCut is what the checkpoint panics with to stop a write where the power would go.
type powerCut struct{}

// bootedFrom is the slot GRUB boots from this BOOT, and its version: grubBoots' choice, "" when
// that slot's boot.cfg or files are missing or not the release its version names.
func bootedFrom(t *testing.T, boot string) (string, string) {
	t.Helper()
	st, err := bootstate.Read(filepath.Join(boot, "grub", "grubenv"))
	if err != nil {
		t.Fatalf("the boot state cannot be read: %v", err)
	}
	chosen := grubBoots(st)
	loads := func(slot string) bool {
		cfg, err := os.ReadFile(filepath.Join(boot, slot, "boot.cfg"))
		if err != nil {
			return false
		}
		for _, name := range []string{"vmlinuz", "initramfs.zst"} {
			data, err := os.ReadFile(filepath.Join(boot, slot, name))
			if !strings.Contains(string(cfg), "/"+slot+"/"+name) || err != nil || !strings.HasSuffix(string(data), " v"+map[string]string{"A": "1", "B": "2"}[slot]) {
				return false
			}
		}
		return true
	}
	if !loads(chosen) {
		return "", "" // the fallback entry might still boot the other slot, but a try is spent on nothing
	}
	return chosen, st.Versions[chosen]
}

// The power goes at every step of writing a release into slot B: each time, BOOT still boots,
// slot A (the running release) from every cut before the boot state is written, slot B on trial
// from the cut after it; slot A's files are never touched.
func TestAPowerCutAtEachUpgradeStepLeavesABootableDisk(t *testing.T) {
	t.Cleanup(func() { upgradeCheckpoint = func(string) {} })
	var steps []string
	upgradeCheckpoint = func(step string) { steps = append(steps, step) }
	if err := writeSlotInto(newRelease(t, goodRelease()), completeBoot(t), "B", 3, func(string, ...interface{}) {}); err != nil {
		t.Fatal(err)
	}
	if len(steps) < 6 || steps[len(steps)-1] != "wrote the boot state" {
		t.Fatalf("the write's steps: %v", steps)
	}
	for i, cutAt := range steps {
		boot := completeBoot(t)
		upgradeCheckpoint = func(step string) {
			if step == cutAt {
				panic(powerCut{})
			}
		}
		func() {
			defer func() {
				if r := recover(); r != (powerCut{}) {
					t.Fatalf("cut after %q: %v", cutAt, r)
				}
			}()
			_ = writeSlotInto(newRelease(t, goodRelease()), boot, "B", 3, func(string, ...interface{}) {})
		}()
		slot, version := bootedFrom(t, boot)
		want := "A"
		if i == len(steps)-1 {
			want = "B"
		}
		if slot != want || version != map[string]string{"A": "0.1.0", "B": "0.2.0"}[want] {
			t.Errorf("cut after %q: GRUB boots slot %q (version %q), want %s", cutAt, slot, version, want)
		}
		if data, err := os.ReadFile(filepath.Join(boot, "A", "vmlinuz")); err != nil || string(data) != "kernel v1" {
			t.Errorf("cut after %q: slot A's kernel is %q (%v)", cutAt, data, err)
		}
	}
}

// completeBoot is BOOT with slot A whole (the running release, the default) and slot B holding
// an older release that GRUB gave up on.
func completeBoot(t *testing.T) string {
	t.Helper()
	boot := newBoot(t, bootstate.State{Default: "A", Rollback: "B", Versions: map[string]string{"A": "0.1.0", "B": "0.0.9"}})
	files := map[string]string{
		"A/initramfs.zst": "initramfs v1",
		"A/boot.cfg":      "linux /A/vmlinuz console=ttyS0 kiln.slot=A\ninitrd /A/initramfs.zst\n",
		"B/vmlinuz":       "kernel v0", "B/initramfs.zst": "initramfs v0",
		"B/boot.cfg": "linux /B/vmlinuz console=ttyS0 kiln.slot=B\ninitrd /B/initramfs.zst\n",
	}
	for name, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(boot, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(boot, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return boot
}
