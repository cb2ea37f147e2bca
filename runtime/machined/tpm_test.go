package main

import (
	"path/filepath"
	"strings"
	"testing"

	"kiln/machined/internal/testkit"
)

func TestReadTPMReportsPCR11InLowercaseHex(t *testing.T) {
	dir := t.TempDir()
	value := strings.Repeat("AB", 32)
	testkit.WriteFile(t, filepath.Join(dir, "pcr-sha256", "11"), value+"\n")
	state := readTPM(dir)
	if state == nil || state.PCR11 != strings.ToLower(value) || state.Error != "" {
		t.Fatalf("got %+v", state)
	}
	if line := state.describe(); line != "TPM 2.0, PCR 11 "+strings.ToLower(value) {
		t.Errorf("line: %q", line)
	}
}

func TestReadTPMWithoutATPMOrWithGarbage(t *testing.T) {
	if state := readTPM(t.TempDir()); state != nil {
		t.Errorf("no TPM: got %+v", state)
	}
	if line := (*tpmState)(nil).describe(); line != "no TPM 2.0" {
		t.Errorf("line: %q", line)
	}
	dir := t.TempDir()
	testkit.WriteFile(t, filepath.Join(dir, "pcr-sha256", "11"), "zz not hex")
	if state := readTPM(dir); state == nil || state.Error == "" || state.PCR11 != "" {
		t.Errorf("garbage: got %+v", state)
	}
	testkit.WriteFile(t, filepath.Join(dir, "pcr-sha256", "11"), strings.Repeat("00", 20))
	if state := readTPM(dir); state == nil || !strings.Contains(state.Error, "not a sha256 value") {
		t.Errorf("sha1-sized: got %+v", state)
	}
}
