package main

import (
	"os"
	"strings"
)

// Kernel command line parameters machined reads.
const (
	paramConfig       = "kiln.config"             // path or http(s) URL of the machine config
	paramDisk         = "kiln.disk"               // the disk machined owns (/dev/vda), or "none" to stay diskless
	paramTest         = "kiln.test"               // "poweroff", "crash" or "pause:STEP" (end-to-end tests; below)
	paramSlot         = "kiln.slot"               // the A/B slot GRUB booted (disk images only)
	paramTrial        = "kiln.trial_timeout"      // seconds a trial slot may take to reach ready before machined reboots
	paramTrialNetwork = "kiln.trial_network_wait" // seconds a trial boot waits for an address before it is judged unhealthy
	paramTrialGrace   = "kiln.trial_grace"        // seconds a trial slot must stay healthy after ready to become the default
	paramPlatform     = "kiln.platform"           // where the machine runs: metal, aws, gcp, azure, ... (its metadata source)
	// "replace": a config drive replaces the config kept on STATE (by default only the first boot's does)
	paramConfigDrive = "kiln.config.drive"
)

// testCrash is kiln.test='s value that makes machined exit right after the ready line.
const testCrash = "crash"

// testPause, as kiln.test=pause:STEP, stops an upgrade for good after STEP (the pull: "pulled";
// or one of the installer's checkpoints, spaces written as '-': "wrote-B/vmlinuz",
// "wrote-B/boot.cfg", "wrote-the-boot-state"), so that the power-cut tests kill QEMU exactly there.
const testPause = "pause:"

// pauseStep is the step kiln.test=pause:STEP names, or "".
func pauseStep(params map[string]string) string {
	if value := params[paramTest]; strings.HasPrefix(value, testPause) {
		return strings.TrimPrefix(value, testPause)
	}
	return ""
}

// parseCmdline splits /proc/cmdline into key=value pairs the way the kernel does:
// whitespace separates, double quotes group; a bare word maps to "". Later ones win.
func parseCmdline(text string) map[string]string {
	params := map[string]string{}
	var word strings.Builder
	quoted := false
	flush := func() {
		if word.Len() == 0 {
			return
		}
		w := word.String()
		word.Reset()
		if k, v, ok := strings.Cut(w, "="); ok {
			params[k] = v
		} else {
			params[w] = ""
		}
	}
	for _, r := range text {
		switch {
		case r == '"':
			quoted = !quoted
		case !quoted && (r == ' ' || r == '\t' || r == '\n'):
			flush()
		default:
			word.WriteRune(r)
		}
	}
	flush()
	return params
}

func readCmdline() map[string]string {
	data, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return map[string]string{}
	}
	return parseCmdline(string(data))
}
