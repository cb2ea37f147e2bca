package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"kiln/machined/internal/resource"
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

// The extensions controller owns what the extensions stacked on the root give the running
// system: extension/status, one per extension as its manifest says, and extension/services, the
// services they define (the services controller runs them under the machine config's). The
// extensions are layers of the read-only root, fixed for a boot, so it reads them once. Their
// modules are loaded before any controller runs, with the kernel's drivers (machine.boot).
const (
	extensionType         resource.Type = "extension/status"
	extensionServicesType resource.Type = "extension/services"

	extensionServicesID = "services"
)

// extensionDirs are where the extensions' layers put their manifests and their service files.
type extensionDirs struct{ manifests, services string }

// stacked is where they are on a booted machine.
var stacked = extensionDirs{manifests: extensionsDir, services: servicesDir}

// extensionServicesSpec is the services the extensions define; a service's spec is not shown,
// as its env may hold secrets.
type extensionServicesSpec struct {
	Names    []string                 `json:"names"`
	Problems []string                 `json:"problems,omitempty"` // the files that could not be loaded, and why
	Specs    []supervisor.ServiceSpec `json:"-"`
}

// readExtensionServices loads the service files of dir (none for ""), saying what fails.
func readExtensionServices(dir string, say func(string, ...interface{})) extensionServicesSpec {
	out := extensionServicesSpec{Names: []string{}}
	if dir == "" {
		return out
	}
	specs, errs := loadServiceDir(dir)
	for _, err := range errs {
		say("services: %v", err)
		out.Problems = append(out.Problems, err.Error())
	}
	for _, s := range specs {
		out.Names = append(out.Names, s.Name)
	}
	out.Specs = specs
	return out
}

type extensionsController struct {
	dirs     extensionDirs
	printf   func(string, ...interface{})
	read     bool // the manifests and services below were read (once per boot)
	found    []Extension
	services extensionServicesSpec
}

func (c *extensionsController) Name() string            { return "extensions" }
func (c *extensionsController) Inputs() []resource.Type { return nil }
func (c *extensionsController) Outputs() []resource.Type {
	return []resource.Type{extensionType, extensionServicesType}
}

func (c *extensionsController) Reconcile(_ context.Context, r *resource.Run) error {
	if !c.read {
		c.found = []Extension{}
		if c.dirs.manifests != "" {
			c.found = listExtensions(c.dirs.manifests)
		}
		c.services = readExtensionServices(c.dirs.services, c.printf)
		c.read = true
	}
	for _, e := range c.found {
		if err := r.Put(extensionType, e.Name, e); err != nil {
			return err
		}
	}
	// last: whoever has awaited the services finds every extension/status there too
	return r.Put(extensionServicesType, extensionServicesID, c.services)
}

// extensionsWait bounds the wait for the extensions controller's first run, which reads a few
// small files: past it, the services start without the extensions' (and it is said).
const extensionsWait = 30 * time.Second

// awaitExtensions waits for the extensions controller's first run and returns the extensions
// and their services (machined not PID 1, with no controllers, reads the directories itself).
func (m *machine) awaitExtensions() ([]Extension, extensionServicesSpec) {
	if m.resources == nil {
		return listExtensions(m.extDirs.manifests), readExtensionServices(m.extDirs.services, m.con.printf)
	}
	ctx, cancel := context.WithTimeout(context.Background(), extensionsWait)
	defer cancel()
	res, err := m.resources.Await(ctx, extensionServicesType, extensionServicesID, nil)
	if err != nil {
		m.con.printf("extensions: not read within %s; going on without their services", extensionsWait)
		return extensionsOf(m.resources), extensionServicesSpec{}
	}
	spec, _ := resource.SpecOf[extensionServicesSpec](res)
	return extensionsOf(m.resources), spec
}

// extensionsOf is every extension/status's manifest, by name.
func extensionsOf(state *resource.State) []Extension {
	out := []Extension{}
	for _, res := range state.List(extensionType) {
		if e, ok := resource.SpecOf[Extension](res); ok && res.Phase == resource.Running {
			out = append(out, e)
		}
	}
	return out
}
