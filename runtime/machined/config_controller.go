package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"

	"kiln/machined/internal/persist"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/safefile"
)

// The config controller composes the machine config from its sources, in their precedence, and
// owns the result: config/machine (what the network, hostname, time and services controllers
// apply, and the whole config for the rest of machined), config/install (the install section the
// disks are set up from) and config/kept (what became of the config kept on STATE this boot).
//
// The sources, first to last: kiln.config= or the config drive (config/source, which the
// boot-config controller reads once); the platform's user data (platform/metadata); the config
// kept on STATE by an earlier boot (read once the disks are set up: volume/status); defaults.
// The platform's facts fill the hostname and network the config leaves open. A config from this
// boot's own sources is kept on STATE for the next boot. A config applied over the API
// (config/applied) is the running one from then on.
const (
	configSourceType  resource.Type = "config/source"  // what kiln.config= or the config drive gave
	configAppliedType resource.Type = "config/applied" // what POST /v1/config made the running config
	keptConfigType    resource.Type = "config/kept"    // what became of the config kept on STATE

	bootSourceID = "boot"
	appliedID    = "applied"
	keptID       = "kept"

	bootConfigOwner = "bootconfig"
	appliedOwner    = "api"
)

// sourceSpec is one source's answer: where its config came from ("" when it gave none), why a
// config that was there could not be used, and the config itself (not shown: it holds the
// API's private key).
type sourceSpec struct {
	Source  string  `json:"source,omitempty"`
	Problem string  `json:"problem,omitempty"`
	Config  *Config `json:"-"`
}

// What the config controller did with STATE's kept config (keptSpec.Action).
const (
	keptUsed    = "used"    // this boot had no config of its own: the kept one runs
	keptWritten = "written" // this boot's config is kept for the next one
	keptNone    = "none"    // no STATE, or neither a kept config nor one of this boot's
)

// keptSpec is config/kept: what became of the config kept on STATE, and where it is.
type keptSpec struct {
	Action  string `json:"action"`
	Path    string `json:"path,omitempty"`
	Problem string `json:"problem,omitempty"` // why it could not be read or written
}

// composition is a config, where it came from, and why a config that was there was not used.
type composition struct {
	cfg     *Config
	source  string
	problem string
}

// configController composes the config once per boot, then follows what the API applies.
type configController struct {
	diskParam    string                       // kiln.disk=, which config/install carries
	stateDir     string                       // where STATE is mounted once volume/status names it
	hasState     func() bool                  // whether some disk has a STATE partition to keep a config on
	driveAllowed func(source string) bool     // whether a config drive may count (configsource_drive.go)
	say          func(string, ...interface{}) // the console

	// this boot's composition; only this controller's goroutine touches it
	platform *platformState // the platform's facts, nil when they do not count (a refused drive's)
	first    *composition   // the boot's own sources and the platform's
	final    *composition   // with the kept config considered, once the disks are set up
	kept     *keptSpec
}

func (c *configController) Name() string { return configOwner }
func (c *configController) Inputs() []resource.Type {
	return []resource.Type{configSourceType, platType, volumeType, configAppliedType}
}
func (c *configController) Outputs() []resource.Type {
	return []resource.Type{machineConfigType, installConfigType, keptConfigType}
}

func (c *configController) Reconcile(_ context.Context, r *resource.Run) error {
	if c.first == nil {
		boot, ok := specAt[sourceSpec](r, configSourceType, bootSourceID)
		plat, fetched := specAt[platformSpec](r, platType, platformID)
		if !ok || !fetched {
			return nil // the boot's sources or the platform's facts are still being read
		}
		c.first = c.compose(boot, plat.fetched)
	}
	install := c.first.cfg.Install
	if err := r.Put(installConfigType, installConfigID, installSpec{Disk: install.Disk, Filesystem: install.Filesystem, Param: c.diskParam}); err != nil {
		return err
	}
	if vol, ok := specAt[volumeSpec](r, volumeType, volumeID); ok && c.final == nil {
		c.final, c.kept = c.settle(vol)
	}
	current := c.final
	if current == nil {
		if c.first.source == "" && c.hasState() {
			// the kept config decides: the network waits for the disks rather than run DHCP on
			// defaults it would give up moments later
			return nil
		}
		current = c.first
	}
	spec := configSpec(current.source, current.cfg)
	spec.Problem = current.problem
	if applied, ok := specAt[machineConfigSpec](r, configAppliedType, appliedID); ok {
		spec = applied
	}
	if err := r.Put(machineConfigType, machineConfigID, spec); err != nil {
		return err
	}
	if c.kept != nil { // after config/machine: whoever waits for config/kept finds the final config there
		return r.Put(keptConfigType, keptID, *c.kept)
	}
	return nil
}

// specAt is the spec of one running resource, false when there is none (or not of type T).
func specAt[T any](r *resource.Run, t resource.Type, id string) (T, bool) {
	res, ok := r.Get(t, id)
	if !ok || res.Phase != resource.Running {
		var none T
		return none, false
	}
	return resource.SpecOf[T](res)
}

// compose takes the boot's own config, else the platform's user data, and fills what it leaves
// open from the platform's facts. Facts from a config drive the drive rule refuses count for
// nothing (not its user data, hostname or network either: the kept config decides), here and
// when the kept config is filled (settle).
func (c *configController) compose(boot sourceSpec, p *platformState) *composition {
	comp := &composition{cfg: &Config{}, source: boot.Source, problem: boot.Problem}
	if boot.Config != nil {
		copied := *boot.Config // the source's spec is the state's: filled on a copy
		comp.cfg = &copied
	}
	if p != nil && p.fromConfigDrive && !c.driveAllowed(p.facts.Source) {
		p = nil
	}
	if c.platform = p; p == nil {
		return comp
	}
	if comp.source == "" && len(p.facts.UserData) > 0 {
		source := p.name() + ":user-data"
		cfg, err := parseConfig(source, p.facts.UserData, false)
		if err != nil {
			c.say("config: %v; using defaults", err)
			comp.problem = err.Error()
		} else {
			comp.cfg, comp.source = cfg, source
			c.say("config: %s", source)
		}
	}
	fillFromPlatform(p, comp.cfg, c.say)
	return comp
}

// settle considers STATE's kept config once the disks are set up: a boot without a config of its
// own runs the kept one; a boot with one keeps it for the next boot.
func (c *configController) settle(vol volumeSpec) (*composition, *keptSpec) {
	if vol.State == "" {
		return c.first, &keptSpec{Action: keptNone}
	}
	path := filepath.Join(c.stateDir, keptConfigFile)
	if c.first.source != "" {
		kept := &keptSpec{Action: keptWritten, Path: path}
		if err := keepConfigIn(c.stateDir, c.first.cfg); err != nil {
			c.say("config: keeping it on STATE: %v", err)
			kept.Problem = err.Error()
		}
		return c.first, kept
	}
	cfg, err := readKeptConfig(c.stateDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return c.first, &keptSpec{Action: keptNone}
	case err != nil:
		c.say("config: kept config: %v", err)
		failed := *c.first
		failed.problem = "kept config: " + err.Error()
		return &failed, &keptSpec{Action: keptNone, Path: path, Problem: err.Error()}
	}
	c.say("config: %s (kept from an earlier boot)", path)
	used := &composition{cfg: cfg, source: path, problem: c.first.problem}
	if c.platform != nil {
		fillFromPlatform(c.platform, cfg, c.say) // without a network or hostname it takes the platform's
	}
	return used, &keptSpec{Action: keptUsed, Path: path}
}

// readKeptConfig reads and parses the config kept in dir: a regular file, never through a link,
// bounded; os.ErrNotExist when there is none.
func readKeptConfig(dir string) (*Config, error) {
	data, err := safefile.ReadUnder(dir, keptConfigFile, maxRemoteConfig)
	if err != nil {
		return nil, err
	}
	return parseConfig(filepath.Join(dir, keptConfigFile), data, true)
}

// keepConfigIn keeps cfg in dir: 0600, as it holds the API's private key; atomic and fsynced,
// so a power cut never leaves a truncated config that the next boot would refuse.
func keepConfigIn(dir string, cfg *Config) error {
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return persist.WriteFileAtomic(filepath.Join(dir, keptConfigFile), data, 0o600)
}

// bootConfigController reads the boot's own config source once: kiln.config= or a config drive
// (PID 1), or -config (not PID 1).
type bootConfigController struct {
	read func() sourceSpec
	done *sourceSpec // only this controller's goroutine touches it
}

func (c *bootConfigController) Name() string             { return bootConfigOwner }
func (c *bootConfigController) Inputs() []resource.Type  { return nil }
func (c *bootConfigController) Outputs() []resource.Type { return []resource.Type{configSourceType} }

func (c *bootConfigController) Reconcile(_ context.Context, r *resource.Run) error {
	if c.done == nil {
		s := c.read()
		c.done = &s
	}
	return r.Put(configSourceType, bootSourceID, *c.done)
}

// awaitConfig waits until the config controller has considered the kept config, takes the
// composed config as the boot's (m.cfg, its source and its problem), and returns
// config/machine's version.
func (m *machine) awaitConfig() uint64 {
	m.awaitBoot(keptConfigType, keptID)
	res, _ := m.resources.Get(machineConfigType, machineConfigID)
	spec, ok := resource.SpecOf[machineConfigSpec](res)
	if !ok || spec.Config == nil {
		m.fatal("config: %s holds a %T", machineConfigType, res.Spec)
	}
	m.cfg, m.configSource, m.configProblem = spec.Config, spec.Source, spec.Problem
	return res.Version
}
