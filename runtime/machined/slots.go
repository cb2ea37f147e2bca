package main

// A/B boot slots on the owned disk's BOOT partition: what this boot is (the default slot,
// a slot on trial, or the other slot chosen by hand), marking a trial slot good once machined
// is ready, and a rollback to the other slot. The state itself is GRUB's environment block
// (internal/bootstate); docs/upgrades.md draws its states.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"kiln/machined/internal/bootstate"
	"kiln/machined/internal/disk"
)

const (
	bootMount           = "/run/kiln/boot"
	defaultTrialTimeout = 10 * time.Minute
)

// slots is the boot state as this boot found it; slot is "" when the boot came from no
// A/B disk (ISO, PXE, a kernel and initramfs), and then nothing here acts. slot, device and
// err are set once by findSlots; the rest changes while the API reads it (a rollback, the
// trial marked good), so it is only touched under mu.
type slots struct {
	slot   string
	device string // the BOOT partition
	err    string // why the state could not be read
	mu     sync.Mutex
	state  bootstate.State
	booted string // "trial", "default" or "other"
	marked bool   // this boot made its trial slot the default
}

// findSlots reads the boot state from the BOOT partition of the owned disk.
func findSlots(slot, owned string, devs []disk.BlockDev) *slots {
	s := &slots{}
	if !bootstate.Valid(slot) || owned == "" {
		return s
	}
	s.slot = slot
	for _, d := range devs {
		if d.IsPartition() && "/dev/"+d.Disk == owned && d.PartName == "BOOT" {
			s.device = d.Path
		}
	}
	if s.device == "" {
		s.err = "no BOOT partition on " + owned
		return s
	}
	err := s.withBoot(syscall.MS_RDONLY, func(dir string) error {
		st, err := bootstate.Read(filepath.Join(dir, "grub", "grubenv"))
		s.state = st
		return err
	})
	if err != nil {
		s.err = err.Error()
		return s
	}
	s.booted = s.state.Booted(slot)
	return s
}

// withBoot mounts BOOT for the length of fn; it is never left mounted, so nothing holds it
// when the machine reboots or an upgrade rewrites it.
func (s *slots) withBoot(flags uintptr, fn func(dir string) error) error {
	if err := os.MkdirAll(bootMount, 0o700); err != nil {
		return err
	}
	flags |= syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC
	if err := syscall.Mount(s.device, bootMount, "vfat", flags, "umask=077"); err != nil {
		return fmt.Errorf("mount BOOT %s: %v", s.device, err)
	}
	err := fn(bootMount)
	if uerr := syscall.Unmount(bootMount, 0); uerr != nil && err == nil {
		err = fmt.Errorf("unmount BOOT: %v", uerr)
	}
	return err
}

func (s *slots) write() error {
	return s.withBoot(0, func(dir string) error {
		return bootstate.Write(filepath.Join(dir, "grub", "grubenv"), s.state)
	})
}

// describe is the console line saying what this boot is.
func (s *slots) describe() string {
	if s == nil || s.slot == "" {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.err != "":
		return fmt.Sprintf("boot: slot %s; boot state: %s", s.slot, s.err)
	case s.booted == "trial":
		return fmt.Sprintf("boot: slot %s on trial (%d tries left after this one)", s.slot, s.state.Tries)
	case s.state.Rollback != "":
		return fmt.Sprintf("boot: slot %s; slot %s did not reach ready and was rolled back", s.slot, s.state.Rollback)
	default:
		return fmt.Sprintf("boot: slot %s (%s)", s.slot, s.booted)
	}
}

// markGood makes a trial slot the default once machined is ready, recording its version.
func (s *slots) markGood(version string) error {
	if s == nil || s.slot == "" || s.err != "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.booted != "trial" {
		return nil
	}
	st := s.state
	st.MarkGood(s.slot)
	st.Versions = copyVersions(st.Versions)
	st.Versions[s.slot] = version
	old := s.state
	s.state = st
	if err := s.write(); err != nil {
		s.state = old
		return err
	}
	s.marked = true
	s.booted = "default" // from now on this boot runs the default slot
	return nil
}

// rollbackTries is how many boots a rolled-back-to slot gets to prove itself healthy before
// GRUB returns to the slot that asked for the rollback.
const rollbackTries = 3

// rollback puts the other slot on trial (it must hold a kernel): it becomes the default once
// it is ready and healthy, and GRUB falls back to this slot should it fail. A boot that is
// itself on trial gives its trial up instead, so the reboot returns to the default slot. The
// caller reboots.
func (s *slots) rollback() (string, error) {
	if s == nil || s.slot == "" {
		return "", errors.New("this machine did not boot from an A/B disk")
	}
	if s.err != "" {
		return "", errors.New("the boot state cannot be read: " + s.err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	other := bootstate.Other(s.slot)
	if s.state.Rollback == other {
		return "", fmt.Errorf("slot %s did not reach ready when it was tried and was rolled back; it is no system to return to", other)
	}
	st := s.state
	if s.booted == "trial" && st.GiveUp(s.slot) {
		return other, s.replaceState(st) // the reboot returns to the default slot
	}
	err := s.withBoot(syscall.MS_RDONLY, func(dir string) error {
		_, err := os.Stat(filepath.Join(dir, other, "boot.cfg"))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("slot %s holds no system to roll back to", other)
	}
	if err := st.Try(other, st.Versions[other], rollbackTries); err != nil {
		return "", err
	}
	return other, s.replaceState(st)
}

// replaceState writes st as the boot state, keeping the old one should the write fail (under mu).
func (s *slots) replaceState(st bootstate.State) error {
	old := s.state
	s.state = st
	if err := s.write(); err != nil {
		s.state = old
		return err
	}
	return nil
}

// status is the boot section of /v1/status.
func (s *slots) status() map[string]interface{} {
	if s == nil || s.slot == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	other := bootstate.Other(s.slot)
	out := map[string]interface{}{
		"slot":             s.slot,
		"booted_as":        s.booted,
		"default":          s.state.Default,
		"previous_slot":    other,
		"previous_version": s.state.Versions[other],
		"rolled_back":      s.state.Rollback != "",
	}
	if s.state.Rollback != "" {
		out["rolled_back_slot"] = s.state.Rollback
		out["rolled_back_version"] = s.state.Versions[s.state.Rollback]
	}
	if s.state.Next != "" {
		out["trial"] = map[string]interface{}{"slot": s.state.Next, "tries_left": s.state.Tries}
	}
	if s.err != "" {
		out["error"] = s.err
	}
	return out
}

// defaultSlot is the slot GRUB boots by default now.
func (s *slots) defaultSlot() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state.Default
}

// trialSlot is the slot on trial now, "" when none.
func (s *slots) trialSlot() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state.Next
}

// bootedAs says what this boot is: "trial", "default" or "other" ("" off an A/B disk).
func (s *slots) bootedAs() string {
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.booted
}

// markedGood says whether this boot made its trial slot the default.
func (s *slots) markedGood() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.marked
}

// trialTimeout is how long a trial boot may take to reach ready (kiln.trial_timeout=, seconds).
func trialTimeout(params map[string]string) time.Duration {
	if n, err := strconv.Atoi(params[paramTrial]); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return defaultTrialTimeout
}

func copyVersions(v map[string]string) map[string]string {
	out := map[string]string{}
	for k, x := range v {
		out[k] = x
	}
	return out
}
