package main

import (
	"path/filepath"
	"reflect"
	"testing"

	"kiln/machined/internal/testkit"
)

func procFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	testkit.WriteFile(t, path, text)
	return path
}

func TestReadLockdownPicksTheBracketedMode(t *testing.T) {
	dir := t.TempDir()
	cases := map[string]string{
		"none [integrity] confidentiality\n": "integrity",
		"[none] integrity confidentiality\n": "none",
		"none integrity [confidentiality]":   "confidentiality",
		"none integrity confidentiality\n":   "",
		"[] [":                               "",
	}
	for text, want := range cases {
		if got := readLockdown(procFile(t, dir, "lockdown", text)); got != want {
			t.Errorf("%q: got %q, want %q", text, got, want)
		}
	}
	if got := readLockdown(filepath.Join(dir, "absent")); got != "" {
		t.Errorf("absent file: got %q", got)
	}
}

func TestLoadedModulesAreSortedNames(t *testing.T) {
	dir := t.TempDir()
	path := procFile(t, dir, "modules", "virtio_balloon 28672 0 - Live 0x0000000000000000\nbochs 16384 0 - Live 0x0000000000000000\n\n")
	if got, want := loadedModules(path), []string{"bochs", "virtio_balloon"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := loadedModules(filepath.Join(dir, "absent")); got == nil || len(got) != 0 {
		t.Errorf("absent file: got %#v, want an empty list", got)
	}
	line := describeModules([]string{"bochs"}, "integrity")
	if line != "kernel: lockdown integrity; 1 modules loaded: bochs" {
		t.Errorf("line: %q", line)
	}
	if line := describeModules(nil, ""); line != "kernel: lockdown unavailable; 0 modules loaded: none" {
		t.Errorf("line: %q", line)
	}
}
