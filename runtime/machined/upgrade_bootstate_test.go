package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln/machined/internal/bootstate"
)

// grubBoots is the slot GRUB's menu boots for a state: the trial slot while it has tries,
// else the default (kiln.image.outputs.grub.slots_config).
func grubBoots(st bootstate.State) string {
	if st.Next != "" && st.Tries > 0 {
		return st.Next
	}
	if st.Default == "B" {
		return "B"
	}
	return "A"
}

func TestAnErrorAfterTheInstallerWroteTheBootStatePutsItBack(t *testing.T) {
	before := bootstate.State{Default: "A", Versions: map[string]string{"A": "0.1.0"}}
	install := func(boot string) func() error {
		return func() error {
			return writeSlotInto(newRelease(t, goodRelease()), boot, "B", defaultTries, func(string, ...interface{}) {})
		}
	}
	for name, tc := range map[string]struct {
		install func(boot string) func() error
		after   func() error
		want    string
	}{
		// the installer wrote the slot and the trial, then EPHEMERAL could not be wiped
		"after fails": {install, func() error { return errors.New("preserve false: wiping EPHEMERAL: EIO") }, "wiping EPHEMERAL"},
		// the installer wrote the trial and then failed (killed at its timeout, say)
		"installer fails late": {func(boot string) func() error {
			return func() error {
				if err := install(boot)(); err != nil {
					return err
				}
				return errors.New("the installer failed (killed)")
			}
		}, nil, "the installer failed"},
		// a hostile installer makes its own slot the default: no trial, no fallback
		"installer takes the default": {func(boot string) func() error {
			return func() error {
				st := bootstate.State{Default: "B", Versions: map[string]string{"A": "0.1.0", "B": "0.2.0"}}
				return bootstate.Write(filepath.Join(boot, "grub", "grubenv"), st)
			}
		}, nil, "made slot \"B\" the default"},
		// one that records another version than the image says
		"installer lies about its version": {func(boot string) func() error {
			return func() error {
				st := bootstate.State{Default: "A", Next: "B", Tries: 3, Versions: map[string]string{"A": "0.1.0", "B": "9.9.9"}}
				return bootstate.Write(filepath.Join(boot, "grub", "grubenv"), st)
			}
		}, nil, "recorded version \"9.9.9\""},
	} {
		boot := newBoot(t, before)
		env := filepath.Join(boot, "grub", "grubenv")
		err := guardBootState(env, "B", "0.2.0", tc.install(boot), tc.after)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "the next boot stays on slot A") {
			t.Errorf("%s: %v", name, err)
			continue
		}
		st, err := bootstate.Read(env)
		if err != nil {
			t.Fatal(err)
		}
		if got := grubBoots(st); got != "A" || st.Next != "" || st.Versions["A"] != "0.1.0" {
			t.Errorf("%s: the next boot is slot %s (state %+v)", name, got, st)
		}
	}

	// and when all goes well the trial stays: the next boot tries slot B
	boot := newBoot(t, before)
	env := filepath.Join(boot, "grub", "grubenv")
	if err := guardBootState(env, "B", "0.2.0", install(boot), func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	st, _ := bootstate.Read(env)
	if got := grubBoots(st); got != "B" || st.Default != "A" {
		t.Fatalf("the next boot is slot %s (state %+v)", got, st)
	}
}

// The installer may write the boot state in BOOT's grub directory and nothing else there: a
// changed menu or an added file fails the upgrade and is put back.
func TestTheInstallerCannotChangeTheGRUBMenu(t *testing.T) {
	before := bootstate.State{Default: "A", Versions: map[string]string{"A": "0.1.0"}}
	menu := "menuentry A { configfile /A/boot.cfg }\n"
	for name, tc := range map[string]struct {
		spoil func(grub string) error
		want  string
	}{
		"a new menu": {func(grub string) error { return os.WriteFile(filepath.Join(grub, "grub.cfg"), []byte("evil\n"), 0o644) }, "changed grub/grub.cfg"},
		"no menu":    {func(grub string) error { return os.Remove(filepath.Join(grub, "grub.cfg")) }, "changed grub/grub.cfg"},
		"an added file": {func(grub string) error {
			return os.WriteFile(filepath.Join(grub, "custom.cfg"), []byte("evil\n"), 0o644)
		}, "added grub/custom.cfg"},
	} {
		boot := newBoot(t, before)
		grub := filepath.Join(boot, "grub")
		if err := os.WriteFile(filepath.Join(grub, "grub.cfg"), []byte(menu), 0o644); err != nil {
			t.Fatal(err)
		}
		env := filepath.Join(grub, "grubenv")
		err := guardBootState(env, "B", "0.2.0", func() error {
			if err := writeSlotInto(newRelease(t, goodRelease()), boot, "B", defaultTries, func(string, ...interface{}) {}); err != nil {
				return err
			}
			return tc.spoil(grub)
		}, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", name, err)
			continue
		}
		got, _ := os.ReadFile(filepath.Join(grub, "grub.cfg"))
		_, extra := os.Stat(filepath.Join(grub, "custom.cfg"))
		st, _ := bootstate.Read(env)
		if string(got) != menu || extra == nil || grubBoots(st) != "A" {
			t.Errorf("%s: menu %q, custom.cfg there: %v, next boot %s", name, got, extra == nil, grubBoots(st))
		}
	}
}
