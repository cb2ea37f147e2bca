package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// The kernel's lockdown mode and the modules it accepted: on a Secure Boot image the kernel runs
// with lockdown=integrity and loads only modules signed with the user's module key, so an operator
// reads here whether that holds and which drivers made it in.

const (
	securityDir  = "/sys/kernel/security"
	lockdownFile = securityDir + "/lockdown"
	modulesFile  = "/proc/modules"
	procLimit    = 1 << 20 // /proc/modules of a few hundred modules is tens of KiB
)

// mountSecurityFS mounts securityfs (read-only) where the lockdown LSM publishes its mode.
func mountSecurityFS() error {
	return mountKernelFS("securityfs", securityDir)
}

// readLockdown is the active mode ("none", "integrity" or "confidentiality") from a file that
// lists them all with the active one in brackets; "" when the kernel has no lockdown LSM.
func readLockdown(path string) string {
	data, err := readLimited(path)
	if err != nil {
		return ""
	}
	for _, field := range strings.Fields(string(data)) {
		if len(field) > 2 && strings.HasPrefix(field, "[") && strings.HasSuffix(field, "]") {
			return field[1 : len(field)-1]
		}
	}
	return ""
}

// loadedModules is the sorted names of the modules in a /proc/modules listing.
func loadedModules(path string) []string {
	names := []string{}
	data, err := readLimited(path)
	if err != nil {
		return names
	}
	for _, line := range strings.Split(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) > 0 {
			names = append(names, fields[0])
		}
	}
	sort.Strings(names)
	return names
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, procLimit))
}

// describeModules is the console's one line on the loaded modules and the lockdown mode.
func describeModules(modules []string, lockdown string) string {
	if lockdown == "" {
		lockdown = "unavailable"
	}
	list := "none"
	if len(modules) > 0 {
		list = strings.Join(modules, ", ")
	}
	return fmt.Sprintf("kernel: lockdown %s; %d modules loaded: %s", lockdown, len(modules), list)
}
