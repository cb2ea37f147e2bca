package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"kiln/machined/internal/supervisor"
)

// extensionsDir holds one manifest per system extension, written by Kiln's imager into
// the extension's layer, so the merged root lists every extension that is stacked.
const extensionsDir = "/usr/local/lib/kiln/extensions"

// Extension is the part of a manifest machined reads; other fields are ignored.
type Extension struct {
	Name    string   `json:"name"`
	Version string   `json:"version,omitempty"`
	Modules []string `json:"modules,omitempty"` // loaded at boot: no device asks for them by alias
}

// moduleName is what a manifest may name: a module's name, never an option or a path.
var moduleName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$`)

// extensionModules lists the modules the extensions name, each once, in order; a name that is
// not a plain module name is left out and reported.
func extensionModules(exts []Extension, say func(string, ...interface{})) []string {
	seen := map[string]bool{}
	var out []string
	for _, e := range exts {
		for _, name := range e.Modules {
			switch {
			case !moduleName.MatchString(name):
				say("extension %s: %q is not a module name; not loaded", e.Name, name)
			case !seen[name]:
				seen[name] = true
				out = append(out, name)
			}
		}
	}
	return out
}

// loadExtensionModules modprobes what the extensions name (-b honours blacklists) and says
// what happened to each: a module the kernel refuses (unsigned under lockdown, or missing) is
// named, and the boot goes on.
func loadExtensionModules(modprobe string, exts []Extension, say func(string, ...interface{})) int {
	names := extensionModules(exts, say)
	if len(names) == 0 {
		return 0
	}
	loaded := 0
	for _, name := range names {
		if out, err := supervisor.Run(modprobe, "-b", name); err != nil {
			say("extension module %s: not loaded: %v %s", name, err, strings.TrimSpace(out))
			continue
		}
		loaded++
	}
	say("extension modules: %d of %d loaded (%s)", loaded, len(names), strings.Join(names, ", "))
	return loaded
}

// listExtensions reads dir/*.json; a manifest without a name is named after its file.
func listExtensions(dir string) []Extension {
	paths, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	out := []Extension{} // "extensions": [] in /v1/status, not null, when there are none
	for _, p := range paths {
		var e Extension
		data, err := os.ReadFile(p)
		if err == nil {
			_ = json.Unmarshal(data, &e)
		}
		if e.Name == "" {
			e.Name = filepath.Base(p[:len(p)-len(".json")])
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
