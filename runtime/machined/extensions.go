package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
)

// extensionsDir holds one manifest per system extension, written by Kiln's imager into
// the extension's layer, so the merged root lists every extension that is stacked.
const extensionsDir = "/usr/local/lib/kiln/extensions"

// Extension is the part of a manifest machined reads; other fields are ignored.
type Extension struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
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
