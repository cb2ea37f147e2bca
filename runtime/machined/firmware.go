package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// What the firmware says about Secure Boot, read from its EFI variables (efivarfs, read-only).
// /v1/status shows it, so an operator can tell a machine that booted through the signed chain
// from one whose firmware does not enforce it.

const (
	efiDir      = "/sys/firmware/efi"
	efivarsDir  = "/sys/firmware/efi/efivars"
	efiGlobal   = "8be4df61-93ca-11d2-aa0d-00e098032b8c" // EFI_GLOBAL_VARIABLE: SecureBoot, SetupMode
	efiVarLimit = 64                                     // a boolean variable is 4 attribute bytes and 1 value byte
)

type firmwareState struct {
	UEFI       bool   `json:"uefi"`
	SecureBoot bool   `json:"secure_boot"`
	SetupMode  bool   `json:"setup_mode"`
	Error      string `json:"error,omitempty"`
}

// mountEFIVars mounts efivarfs read-only on a UEFI boot; a BIOS boot has no /sys/firmware/efi.
func mountEFIVars() error {
	if _, err := os.Stat(efiDir); err != nil {
		return nil
	}
	return mountKernelFS("efivarfs", efivarsDir)
}

// mountKernelFS mounts a kernel pseudo-filesystem (efivarfs, securityfs) read-only at target,
// unless something is mounted there already.
func mountKernelFS(fstype, target string) error {
	if _, ok := mountedAt(readMounts(), target); ok {
		return nil
	}
	flags := uintptr(syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC)
	if err := syscall.Mount(fstype, target, fstype, flags, ""); err != nil {
		return fmt.Errorf("mount %s on %s: %v", fstype, target, err)
	}
	return nil
}

// readFirmware reads the firmware's state below efi (normally /sys/firmware/efi).
func readFirmware(efi string) firmwareState {
	if _, err := os.Stat(efi); err != nil {
		return firmwareState{}
	}
	state := firmwareState{UEFI: true}
	vars := filepath.Join(efi, "efivars")
	secure, err := readEFIBool(vars, "SecureBoot")
	if err != nil {
		state.Error = err.Error()
		return state
	}
	setup, err := readEFIBool(vars, "SetupMode")
	if err != nil {
		state.Error = err.Error()
	}
	state.SecureBoot, state.SetupMode = secure, setup
	return state
}

// readEFIBool reads a boolean global variable; absent means false (firmware without Secure Boot).
func readEFIBool(vars, name string) (bool, error) {
	f, err := os.Open(filepath.Join(vars, name+"-"+efiGlobal))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("EFI variable %s: %v", name, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, efiVarLimit+1))
	if err != nil {
		return false, fmt.Errorf("EFI variable %s: %v", name, err)
	}
	if len(data) != 5 || data[4] > 1 {
		return false, fmt.Errorf("EFI variable %s: %d bytes, not a boolean", name, len(data))
	}
	return data[4] == 1, nil
}

// describe is the console's one line on the firmware.
func (s firmwareState) describe() string {
	switch {
	case !s.UEFI:
		return "BIOS (no Secure Boot)"
	case s.Error != "":
		return "UEFI, Secure Boot unknown: " + s.Error
	case s.SecureBoot:
		return "UEFI, Secure Boot on"
	case s.SetupMode:
		return "UEFI, Secure Boot off (setup mode: no platform key enrolled)"
	default:
		return "UEFI, Secure Boot off"
	}
}
