package main

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Measured boot: the TPM's PCR 11, which systemd's EFI stub extends with each section of the
// UKI it started. /v1/status shows it, so an operator (or a test) can compare it with the value
// the image's PCR key signed at build time (the UKI's .pcrsig).

const tpmDir = "/sys/class/tpm/tpm0"

type tpmState struct {
	PCR11 string `json:"pcr11_sha256,omitempty"` // lowercase hex; empty without a TPM 2.0
	Error string `json:"error,omitempty"`
}

// readTPM reads PCR 11 of the sha256 bank below dir (normally /sys/class/tpm/tpm0); a machine
// without a TPM, or with a TPM 1.2, has no such file and reports nothing.
func readTPM(dir string) *tpmState {
	path := filepath.Join(dir, "pcr-sha256", "11")
	if _, err := os.Stat(filepath.Join(dir, "pcr-sha256")); err != nil {
		return nil
	}
	data, err := readLimited(path)
	if err != nil {
		return &tpmState{Error: err.Error()}
	}
	value := strings.ToLower(strings.TrimSpace(string(data)))
	if raw, err := hex.DecodeString(value); err != nil || len(raw) != 32 {
		return &tpmState{Error: fmt.Sprintf("%s: not a sha256 value: %.80q", path, value)}
	}
	return &tpmState{PCR11: value}
}

// describe is the console's one line on the TPM.
func (s *tpmState) describe() string {
	switch {
	case s == nil:
		return "no TPM 2.0"
	case s.Error != "":
		return "TPM 2.0: " + s.Error
	default:
		return "TPM 2.0, PCR 11 " + s.PCR11
	}
}
