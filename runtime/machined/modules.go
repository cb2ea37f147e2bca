package main

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"kiln/machined/internal/supervisor"
)

const modprobe = "/usr/sbin/modprobe"

// collectModaliases reads the modalias of every device on a bus (root is /sys/bus): each
// names the module that drives it, which is how machined loads drivers without udev. Drivers
// bind only to bus devices, so /sys/bus/*/devices/* holds every alias that can load one
// (udev's coldplug walks the same lists), in a few hundred reads instead of a walk of all of
// /sys/devices.
func collectModaliases(root string) []string {
	seen := map[string]bool{}
	paths, _ := filepath.Glob(filepath.Join(root, "*", "devices", "*", "modalias"))
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // sysfs has unreadable corners; they drive nothing we can load
		}
		if alias := string(bytes.TrimSpace(data)); alias != "" {
			seen[alias] = true
		}
	}
	out := make([]string, 0, len(seen))
	for a := range seen {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// loadModules runs modprobe on every device's alias. Loading a driver can reveal new
// devices (a PCI virtio device brings a virtio bus device), so it repeats until nothing
// new appears, or at once when the pass loaded no module (nothing can have appeared: the
// usual case on a kernel with its drivers built in, where a second walk of /sys cost a
// third of a second under emulation). Aliases with no module are normal and quiet (-q);
// -b honours blacklists.
func loadModules(release string, say func(string, ...interface{})) {
	if _, err := os.Stat(filepath.Join("/usr/lib/modules", release, "modules.alias")); err != nil {
		say("no modules for kernel %s: drivers are built in or missing", release)
		return
	}
	if _, err := os.Stat(modprobe); err != nil {
		say("%s missing: no kernel modules loaded", modprobe)
		return
	}
	tried := map[string]bool{}
	for pass := 0; pass < 4; pass++ {
		var fresh []string
		for _, a := range collectModaliases("/sys/bus") {
			if !tried[a] {
				tried[a] = true
				fresh = append(fresh, a)
			}
		}
		if len(fresh) == 0 {
			break
		}
		before := len(loadedModules(modulesFile))
		for _, batch := range batches(fresh, 256) {
			// a non-zero exit usually means some alias had no module; modprobe -q says nothing
			// what it does print is a module the kernel refused (an unsigned one under lockdown)
			if out, err := supervisor.Run(modprobe, append([]string{"-b", "-q", "-a"}, batch...)...); err != nil && strings.TrimSpace(out) != "" {
				say("modprobe: %v: %s", err, strings.TrimSpace(out))
			}
		}
		if len(loadedModules(modulesFile)) == before {
			break
		}
	}
	say("modules loaded for %d device aliases", len(tried))
}

func batches(items []string, size int) [][]string {
	var out [][]string
	for len(items) > size {
		out = append(out, items[:size])
		items = items[size:]
	}
	if len(items) > 0 {
		out = append(out, items)
	}
	return out
}
