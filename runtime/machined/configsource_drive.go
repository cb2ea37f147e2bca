package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"kiln/machined/internal/disk"
	"kiln/machined/internal/safefile"
)

// configDriveReplace is kiln.config.drive='s one value: a config drive replaces the kept config.
const configDriveReplace = "replace"

// keptProbeMount is where STATE is mounted read-only, for a moment, to see whether it keeps a
// config, before the boot decides whether a config drive may give one.
const keptProbeMount = "/run/kiln/state-probe"

// driveVerdict is whether a config drive (cidata or KILNCFG, or the nocloud platform's cidata
// drive) may give this boot's config: decided once per boot, said on the console.
type driveVerdict struct {
	decided bool
	allowed bool
	why     string
}

// decideConfigDrive is the rule. Any block device may carry a config drive's label (a USB stick
// someone plugs in), and its config defines root services and the API's CA, so once a machine
// keeps a config on STATE a drive does not replace it: only on the first boot (no kept config
// yet, or none that can be read), or when the kernel command line says kiln.config.drive=replace
// (the boot entry is the image owner's choice, which a stick cannot make).
func decideConfigDrive(mode, kept string, probeErr error) driveVerdict {
	v := driveVerdict{decided: true}
	switch {
	case mode == configDriveReplace:
		v.allowed, v.why = true, paramConfigDrive+"="+configDriveReplace
		if kept != "" {
			v.why = "it replaces the config kept in " + kept + " (" + v.why + ")"
		}
	case kept == "" && probeErr != nil:
		v.allowed, v.why = true, fmt.Sprintf("no kept config could be read (%v)", probeErr)
	case kept == "":
		v.allowed = true // the first boot: the usual case, nothing to say
	default:
		v.why = fmt.Sprintf("a config is kept in %s from an earlier boot, and a config drive replaces it "+
			"only on the first boot; to let it, boot with %s=%s on the kernel command line",
			kept, paramConfigDrive, configDriveReplace)
	}
	if mode != "" && mode != configDriveReplace {
		v.why = strings.TrimSpace(v.why + fmt.Sprintf(" (%s=%q is not %q and means nothing)", paramConfigDrive, mode, configDriveReplace))
	}
	return v
}

// configDriveAllowed says whether the config drive source (a device, or "nocloud drive
// /dev/sr0") may give the config, saying why on the console when it may not, or when it may
// only because of the kernel command line or an unreadable STATE.
func (m *machine) configDriveAllowed(source string) bool {
	if !m.configDrive.decided {
		kept, err := "", error(nil)
		if m.params[paramConfigDrive] != configDriveReplace {
			kept, err = findKeptConfig(disk.ListBlockDevices("/sys"), readKeptConfigOn)
		}
		m.configDrive = decideConfigDrive(m.params[paramConfigDrive], kept, err)
	}
	switch {
	case !m.configDrive.allowed:
		m.con.printf("config: config drive %s ignored: %s", source, m.configDrive.why)
	case m.configDrive.why != "":
		m.con.printf("config: config drive %s used: %s", source, m.configDrive.why)
	}
	return m.configDrive.allowed
}

// findKeptConfig looks on every partition named STATE (there is one, on the disk machined
// owns; a second one, on a stick say, only makes the answer "kept") for a kept config, and
// returns where one is ("/dev/vda5:config.json"), or "" with the last error met.
func findKeptConfig(devs []disk.BlockDev, keptOn func(dev string) (bool, error)) (string, error) {
	var lastErr error
	for _, b := range devs {
		if !b.IsPartition() || b.PartName != "STATE" {
			continue
		}
		kept, err := keptOn(b.Path)
		if err != nil {
			lastErr = fmt.Errorf("%s: %v", b.Path, err)
			continue
		}
		if kept {
			return b.Path + ":config.json", nil
		}
	}
	return "", lastErr
}

// readKeptConfigOn mounts a STATE partition read-only for a moment and says whether it keeps a
// config (config.json, a regular file that is not empty).
func readKeptConfigOn(dev string) (bool, error) {
	fstype, _, err := disk.ProbeFS(dev)
	if err != nil {
		return false, err
	}
	if fstype == "" {
		return false, nil // never formatted: the first boot stopped early
	}
	if err := os.MkdirAll(keptProbeMount, 0o700); err != nil {
		return false, err
	}
	flags := uintptr(syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC)
	if err := syscall.Mount(dev, keptProbeMount, fstype, flags, ""); err != nil {
		return false, fmt.Errorf("mount (%s): %v", fstype, err)
	}
	defer syscall.Unmount(keptProbeMount, 0)
	return keptConfigIn(keptProbeMount)
}

// keptConfigIn says whether dir (STATE's root) keeps a config.
func keptConfigIn(dir string) (bool, error) {
	data, err := safefile.ReadUnder(dir, "config.json", maxRemoteConfig)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return len(data) > 0, nil
}
