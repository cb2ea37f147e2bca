package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeEFIVar(t *testing.T, efi, name string, data []byte) {
	t.Helper()
	vars := filepath.Join(efi, "efivars")
	if err := os.MkdirAll(vars, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vars, name+"-"+efiGlobal), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFirmwareStates(t *testing.T) {
	attrs := []byte{6, 0, 0, 0}
	cases := []struct {
		name         string
		secure, mode []byte // nil: the variable is absent
		want         firmwareState
		line         string
	}{
		{"secure boot on", append(attrs, 1), append(attrs, 0), firmwareState{UEFI: true, SecureBoot: true}, "Secure Boot on"},
		{"off", append(attrs, 0), append(attrs, 0), firmwareState{UEFI: true}, "Secure Boot off"},
		{"setup mode", append(attrs, 0), append(attrs, 1), firmwareState{UEFI: true, SetupMode: true}, "setup mode"},
		{"no secure boot variables", nil, nil, firmwareState{UEFI: true}, "Secure Boot off"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			efi := t.TempDir()
			if err := os.MkdirAll(filepath.Join(efi, "efivars"), 0o755); err != nil {
				t.Fatal(err)
			}
			if c.secure != nil {
				writeEFIVar(t, efi, "SecureBoot", c.secure)
			}
			if c.mode != nil {
				writeEFIVar(t, efi, "SetupMode", c.mode)
			}
			got := readFirmware(efi)
			if got != c.want {
				t.Fatalf("readFirmware = %+v, want %+v", got, c.want)
			}
			if !strings.Contains(got.describe(), c.line) {
				t.Fatalf("describe() = %q, want it to say %q", got.describe(), c.line)
			}
		})
	}
}

func TestFirmwareBIOSAndMalformedVariables(t *testing.T) {
	if got := readFirmware(filepath.Join(t.TempDir(), "absent")); got != (firmwareState{}) || !strings.Contains(got.describe(), "BIOS") {
		t.Fatalf("no /sys/firmware/efi: %+v %q", got, got.describe())
	}
	for name, data := range map[string][]byte{
		"short":     {6, 0},
		"long":      make([]byte, 4096),
		"not bool":  {6, 0, 0, 0, 7},
		"empty var": {},
	} {
		efi := t.TempDir()
		writeEFIVar(t, efi, "SecureBoot", data)
		got := readFirmware(efi)
		if got.SecureBoot || got.Error == "" || !strings.Contains(got.describe(), "unknown") {
			t.Fatalf("%s: a malformed SecureBoot variable must read as an error, got %+v", name, got)
		}
	}
}
