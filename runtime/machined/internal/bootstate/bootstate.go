// Package bootstate reads and writes the A/B boot state that GRUB and machined share.
//
// The state lives in GRUB's environment block on the BOOT partition (grub/grubenv): GRUB
// must read it before any kernel runs and count a trial slot's tries down with save_env,
// which only rewrites an existing file's blocks in place. machined changes the state by
// writing a whole new block beside it, syncing it, and renaming it over the old one, so a
// crash leaves either the old block or the new one. The grub.cfg that reads it is written
// by Kiln's imager (kiln.image.outputs.grub); docs/upgrades.md draws the states.
package bootstate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"kiln/machined/internal/safefile"
)

const (
	// Size is the size of a GRUB environment block.
	Size = 1024
	// MaxTries bounds a trial slot's tries: the menu counts down without arithmetic, one
	// branch per value.
	MaxTries = 9
	header   = "# GRUB Environment Block\n"
)

// Slots are the two boot slots on BOOT.
var Slots = []string{"A", "B"}

// State is what the boot menu and machined agree on.
type State struct {
	Default  string            // the slot booted when no trial is pending (A or B)
	Next     string            // the slot on trial, "" when none
	Tries    int               // boots the trial slot has left
	Rollback string            // the trial slot GRUB gave up on, until the next upgrade
	Versions map[string]string // slot -> the Kiln version installed there
	Extra    map[string]string // variables of others, kept as they are
}

// Other is the slot that is not s.
func Other(s string) string {
	if s == "A" {
		return "B"
	}
	return "A"
}

// Valid reports whether s names a slot.
func Valid(s string) bool { return s == "A" || s == "B" }

// Parse reads a GRUB environment block. What GRUB itself would ignore (comments, the '#'
// padding) is skipped; a block without GRUB's header or of the wrong size is an error.
func Parse(block []byte) (State, error) {
	st := State{Default: "A", Versions: map[string]string{}, Extra: map[string]string{}}
	if len(block) != Size {
		return st, fmt.Errorf("boot state: %d bytes, a GRUB environment block has %d", len(block), Size)
	}
	if !bytes.HasPrefix(block, []byte(header)) {
		return st, errors.New("boot state: no GRUB environment block header")
	}
	for _, line := range strings.Split(string(block[len(header):]), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			return st, fmt.Errorf("boot state: malformed line %q", line)
		}
		switch {
		case name == "kiln_default":
			if Valid(value) {
				st.Default = value
			}
		case name == "kiln_next":
			if Valid(value) {
				st.Next = value
			}
		case name == "kiln_tries":
			n, err := strconv.Atoi(value)
			if err == nil && n >= 0 && n <= MaxTries {
				st.Tries = n
			}
		case name == "kiln_rollback":
			if Valid(value) {
				st.Rollback = value
			}
		case strings.HasPrefix(name, "kiln_version_") && Valid(strings.TrimPrefix(name, "kiln_version_")):
			st.Versions[strings.TrimPrefix(name, "kiln_version_")] = value
		default:
			st.Extra[name] = value
		}
	}
	if st.Next == "" {
		st.Tries = 0
	}
	return st, nil
}

// Encode writes the state as a GRUB environment block, variables in a fixed order.
func (st State) Encode() ([]byte, error) {
	var b strings.Builder
	b.WriteString(header)
	bad := ""
	put := func(name, value string) {
		if strings.ContainsAny(name+value, "\n\\") || strings.Contains(name, "=") {
			bad = name
		}
		b.WriteString(name + "=" + value + "\n")
	}
	put("kiln_default", st.Default)
	if st.Next != "" {
		put("kiln_next", st.Next)
		put("kiln_tries", strconv.Itoa(st.Tries))
	}
	if st.Rollback != "" {
		put("kiln_rollback", st.Rollback)
	}
	for _, slot := range Slots {
		if v, ok := st.Versions[slot]; ok {
			put("kiln_version_"+slot, v)
		}
	}
	names := make([]string, 0, len(st.Extra))
	for name := range st.Extra {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		put(name, st.Extra[name])
	}
	if bad != "" {
		return nil, fmt.Errorf("boot state: %s holds a newline, '=' or a backslash, which GRUB's block escapes", bad)
	}
	text := b.String()
	if len(text) > Size {
		return nil, fmt.Errorf("boot state: %d bytes do not fit a %d-byte GRUB environment block", len(text), Size)
	}
	return []byte(text + strings.Repeat("#", Size-len(text))), nil
}

// Booted is what the boot that ran as `slot` means: "trial" when it is the slot on trial,
// "default" when it is the default slot, "other" when someone chose the other entry by hand.
func (st State) Booted(slot string) string {
	switch {
	case st.Next != "" && slot == st.Next:
		return "trial"
	case slot == st.Default:
		return "default"
	default:
		return "other"
	}
}

// MarkGood makes a trial slot that reached ready the default; it reports whether the state changed.
func (st *State) MarkGood(slot string) bool {
	if st.Next == "" || slot != st.Next {
		return false
	}
	st.Default, st.Next, st.Tries, st.Rollback = slot, "", 0, ""
	return true
}

// GiveUp ends the trial of `slot` as failed, as GRUB does when its tries run out: the default
// stays, and `slot` is marked rolled back. It reports whether `slot` was on trial.
func (st *State) GiveUp(slot string) bool {
	if st.Next == "" || slot != st.Next {
		return false
	}
	st.Next, st.Tries, st.Rollback = "", 0, slot
	return true
}

// Try puts `slot` on trial for `tries` boots, holding `version`; the default stays as it is
// until machined marks the trial slot good.
func (st *State) Try(slot, version string, tries int) error {
	if !Valid(slot) {
		return fmt.Errorf("boot state: no slot %q", slot)
	}
	if tries < 1 || tries > MaxTries {
		return fmt.Errorf("boot state: tries must be 1 to %d, not %d", MaxTries, tries)
	}
	st.Next, st.Tries, st.Rollback = slot, tries, ""
	if st.Versions == nil {
		st.Versions = map[string]string{}
	}
	st.Versions[slot] = version
	return nil
}

// Read loads the state from a grubenv file: a regular file, not a link, read up to a bound
// (the block is Size bytes; a larger file is refused rather than read whole into PID 1).
func Read(path string) (State, error) {
	block, err := safefile.ReadFile(path, 64*Size)
	if err != nil {
		return State{Default: "A"}, fmt.Errorf("boot state: %v", err)
	}
	return Parse(block)
}

// Write replaces the grubenv file with the state: a new block beside it, synced, renamed
// over the old one, and the directory synced, so a crash leaves the old block or the new.
func Write(path string, st State) error {
	block, err := st.Encode()
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp := filepath.Join(dir, "grubenv.new")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("boot state: %v", err)
	}
	if _, err := f.Write(block); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("boot state: writing %s: %v", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("boot state: syncing %s: %v", tmp, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("boot state: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("boot state: %v", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
