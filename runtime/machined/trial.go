package main

// A trial boot must prove it is healthy before it becomes the default: reaching ready is not
// enough when the release cannot be reached (no address, the API down) or runs on defaults
// because its config could not be read. An unhealthy trial reboots, so GRUB counts the next try
// and, with none left, falls back to the slot that worked.

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const defaultTrialNetworkWait = 30 * time.Second

// trialProblems says what keeps this trial boot from being marked good; empty when healthy.
func (m *machine) trialProblems() []string {
	return trialVerdict(m.configProblem, m.cfg.API.Enabled(), m.runningAPI().addr != "", hasAddress, trialNetworkWait(m.params))
}

// trialVerdict judges a trial boot: its config was read (no fallback to defaults), the API
// the config asks for listens, and some interface has an address within wait.
func trialVerdict(configProblem string, apiWanted, apiUp bool, addressed func() bool, wait time.Duration) []string {
	problems := configAndAPIProblems(configProblem, apiWanted, apiUp)
	deadline := time.Now().Add(wait)
	for !addressed() {
		if !time.Now().Before(deadline) {
			problems = append(problems, fmt.Sprintf("no interface has an address after %s", wait))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return problems
}

// configAndAPIProblems: the config found could be used, and the API it asks for listens.
func configAndAPIProblems(configProblem string, apiWanted, apiUp bool) []string {
	var problems []string
	if configProblem != "" {
		problems = append(problems, "its config could not be used ("+configProblem+")")
	}
	if apiWanted && !apiUp {
		problems = append(problems, "the API the config asks for did not start")
	}
	return problems
}

// hasAddress says whether some interface has an address others can reach: IPv4 or IPv6,
// neither loopback nor link-local.
func hasAddress() bool { return anyGlobal(kernelAddresses()) }

// trialNetworkWait is how long a trial boot waits for an address (kiln.trial_network_wait=, seconds).
func trialNetworkWait(params map[string]string) time.Duration {
	if n, err := strconv.Atoi(params[paramTrialNetwork]); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	return defaultTrialNetworkWait
}

// failTrial says why the trial is not healthy and reboots for GRUB's next try (as PID 1).
func (m *machine) failTrial(problems []string) {
	m.con.printf("boot: slot %s is on trial and not healthy: %s; rebooting for the next try", m.slots.slot, strings.Join(problems, "; "))
	if !m.pid1 {
		return
	}
	syscall.Sync()
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
	select {}
}
