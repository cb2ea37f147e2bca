package main

import (
	"bytes"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"kiln/machined/internal/safefile"
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
// -b honours blacklists. Returns how many modules it loaded.
func loadModules(release string, say func(string, ...interface{})) int {
	aliasFile := filepath.Join("/usr/lib/modules", release, "modules.alias")
	if _, err := os.Stat(aliasFile); err != nil {
		say("no modules for kernel %s: drivers are built in or missing", release)
		return 0
	}
	patterns := aliasPatterns(aliasFile)
	if _, err := os.Stat(modprobe); err != nil {
		say("%s missing: no kernel modules loaded", modprobe)
		return 0
	}
	initial := len(loadedModules(modulesFile))
	tried := map[string]bool{}
	for pass := 0; pass < 4; pass++ {
		var fresh []string
		for _, a := range collectModaliases("/sys/bus") {
			if !tried[a] {
				tried[a] = true
				fresh = append(fresh, a)
			}
		}
		candidates := mayMatch(fresh, patterns)
		if len(candidates) == 0 {
			break // no module of this kernel drives these devices: no modprobe to start
		}
		before := len(loadedModules(modulesFile))
		for _, batch := range batches(candidates, 256) {
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
	return len(loadedModules(modulesFile)) - initial
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

// aliasLimit bounds what aliasPatterns reads; a larger modules.alias (none is near it: a
// distribution kernel's is about 1.5 MB) leaves every alias to modprobe.
const aliasLimit = 32 << 20

// aliasPatterns reads the patterns of modules.alias ("alias PATTERN MODULE" lines): the
// aliases of the modules that can be loaded (built-in ones are in modules.builtin.alias).
// nil when the file cannot be read whole: then nothing is ruled out.
func aliasPatterns(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	data, err := safefile.ReadAtMost(f, aliasLimit)
	if err != nil {
		return nil
	}
	patterns := []string{}
	for _, line := range strings.Split(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) == 3 && fields[0] == "alias" {
			patterns = append(patterns, fields[1])
		}
	}
	return patterns
}

// mayMatch keeps the aliases some pattern may match, as modprobe matches them (fnmatch without
// flags); with no patterns known (nil), all of them. path.Match differs from fnmatch only on
// '/', so an alias holding one, or a pattern path.Match cannot parse, is kept: modprobe decides.
func mayMatch(aliases, patterns []string) []string {
	if patterns == nil {
		return aliases
	}
	var kept []string
	for _, alias := range aliases {
		if strings.Contains(alias, "/") {
			kept = append(kept, alias)
			continue
		}
		for _, pattern := range patterns {
			if ok, err := path.Match(pattern, alias); ok || err != nil {
				kept = append(kept, alias)
				break
			}
		}
	}
	return kept
}
