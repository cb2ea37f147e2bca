package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"kiln/machined/internal/supervisor"
)

const modprobe = "/usr/sbin/modprobe"

// collectModaliases walks a sysfs devices tree for modalias files: each present device
// names the module that drives it, which is how machined loads drivers without udev.
func collectModaliases(root string) []string {
	seen := map[string]bool{}
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // sysfs has unreadable corners; they drive nothing we can load
		}
		if d.Type().IsRegular() && d.Name() == "modalias" {
			data, err := os.ReadFile(path)
			if err == nil {
				if alias := string(bytes.TrimSpace(data)); alias != "" {
					seen[alias] = true
				}
			}
		}
		return nil
	})
	out := make([]string, 0, len(seen))
	for a := range seen {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// loadModules runs modprobe on every device's alias. Loading a driver can reveal new
// devices (a PCI virtio device brings a virtio bus device), so it repeats until nothing
// new appears. Aliases with no module are normal and quiet (-q); -b honours blacklists.
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
		for _, a := range collectModaliases("/sys/devices") {
			if !tried[a] {
				tried[a] = true
				fresh = append(fresh, a)
			}
		}
		if len(fresh) == 0 {
			break
		}
		for _, batch := range batches(fresh, 256) {
			// a non-zero exit usually means some alias had no module; modprobe -q says nothing
			// what it does print is a module the kernel refused (an unsigned one under lockdown)
			if out, err := supervisor.Run(modprobe, append([]string{"-b", "-q", "-a"}, batch...)...); err != nil && strings.TrimSpace(out) != "" {
				say("modprobe: %v: %s", err, strings.TrimSpace(out))
			}
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
