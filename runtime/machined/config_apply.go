package main

// Day-2 config: POST /v1/config (api_config.go) hands a new machine config to ApplyConfig,
// which checks it with the parser the boot uses, keeps it on STATE where the boot finds it, and
// puts the running config it makes (the sections that can change while the machine runs) as
// config/applied, which the config controller makes the machine config resource, whose
// controllers apply them. The others wait for the next boot.

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	"kiln/machined/internal/persist"
	"kiln/machined/internal/resource"
)

// The modes of POST /v1/config.
const (
	applyAuto   = "auto"    // the live sections now, the others at the next boot
	applyStaged = "staged"  // kept only: everything at the next boot
	applyDryRun = "dry_run" // what auto would do; nothing written or applied
)

// The result of one section.
const (
	sectionApplied   = "applied"
	sectionStaged    = "staged for the next boot"
	sectionUnchanged = "unchanged"
	sectionNotKept   = "not applied" // the next boot reads its config from elsewhere
)

// keptConfigFile is the config kept on STATE (the config controller writes it at boot: keepConfigIn).
const keptConfigFile = "config.json"

// liveConfig is how a new config reaches the running machine.
type liveConfig struct {
	applyMu sync.Mutex // one apply at a time, from its checks to its publishing

	clockMu sync.Mutex // guards machine.clock between startClock and the time controller

	apiMu sync.Mutex // guards api, which the API controller sets
	api   runningAPI // the API that runs; its TLS side is nil when the API is off

	serveAPI func(APIConfig) (*apiServer, error) // tests: instead of serving one on the config's address

	keptDir     string                  // tests: the directory the config is kept in instead of STATE
	setHostname func(name string) error // tests: instead of sethostname(2)
}

// configRequest is one POST /v1/config: the document (YAML or JSON), its mode, and who sent it.
type configRequest struct {
	Mode   string
	Doc    []byte
	Who    string
	Client []*x509.Certificate // the certificate the request came with, then its intermediates
}

// sectionResult is what one top-level section of the new config does.
type sectionResult struct {
	Section string `json:"section"`
	Result  string `json:"result"`
	Why     string `json:"why,omitempty"`
}

// configReport is POST /v1/config's answer.
type configReport struct {
	Mode string `json:"mode"`
	// Kept is where the config was written ("" when it was not: a dry run).
	Kept string `json:"kept,omitempty"`
	// ConfigVersion is the version of config/machine that carries the live sections (0 when
	// nothing is published); network/status reaches it once the network is applied.
	ConfigVersion uint64          `json:"config_version,omitempty"`
	Sections      []sectionResult `json:"sections"`
	Notes         []string        `json:"notes,omitempty"`
}

// configSection is one top-level field of the config: how to read it, copy it into the running
// config, and why a change of it waits for the next boot ("" when it takes effect now).
type configSection struct {
	name    string
	value   func(c *Config) interface{}
	set     func(running, next *Config)
	waitFor func(running, next *Config, client []*x509.Certificate) string
}

func never(why string) func(running, next *Config, client []*x509.Certificate) string {
	return func(running, next *Config, client []*x509.Certificate) string { return why }
}

func now(running, next *Config, client []*x509.Certificate) string { return "" }

// configSections are the config's top-level fields in the order the documentation lists them.
// hostname, network, time and services reach their controllers through config/machine; the health checks
// are read at each health verdict, registries and the signature policy whenever an upgrade starts
// (runningConfig).
var configSections = []configSection{
	{"hostname", func(c *Config) interface{} { return c.Hostname }, func(r, n *Config) { r.Hostname = n.Hostname },
		func(running, next *Config, client []*x509.Certificate) string {
			if next.Hostname == "" {
				return "without a hostname the machine keeps the one it has until the next boot"
			}
			return ""
		}},
	{"install", func(c *Config) interface{} { return c.Install }, nil, never("the disk is chosen and set up at boot")},
	{"network", func(c *Config) interface{} { return c.Network }, func(r, n *Config) { r.Network = n.Network }, now},
	{"services", func(c *Config) interface{} { return c.Services }, func(r, n *Config) { r.Services = n.Services }, now},
	{"api", func(c *Config) interface{} { return c.API }, func(r, n *Config) { r.API = n.API }, apiWaitsFor},
	{"time", func(c *Config) interface{} { return c.Time }, func(r, n *Config) { r.Time = n.Time },
		func(running, next *Config, client []*x509.Certificate) string {
			if running.Time.Disabled != next.Time.Disabled {
				return "time sync is turned on or off at boot"
			}
			return ""
		}},
	{"health", func(c *Config) interface{} { return c.Health }, func(r, n *Config) { r.Health = n.Health }, now},
	{"registries", func(c *Config) interface{} { return c.Registries }, func(r, n *Config) { r.Registries = n.Registries }, now},
	{"release_keys", func(c *Config) interface{} { return c.ReleaseKeys }, func(r, n *Config) { r.ReleaseKeys = n.ReleaseKeys }, now},
	{"require_signatures", func(c *Config) interface{} { return c.RequireSignatures },
		func(r, n *Config) { r.RequireSignatures = n.RequireSignatures }, now},
	{"allow_unsigned", func(c *Config) interface{} { return c.AllowUnsigned }, func(r, n *Config) { r.AllowUnsigned = n.AllowUnsigned }, now},
}

// apiWaitsFor lets a new certificate and key take effect now (a leaked machine key is replaced
// without a reboot), and a new client CA when the certificate the config came with chains to it:
// the client that applies it keeps its access, so a client CA no client holds a certificate of
// never shuts everyone out. The address, and turning the API on or off, wait for the next boot.
func apiWaitsFor(running, next *Config, client []*x509.Certificate) string {
	switch {
	case running.API.Enabled() != next.API.Enabled():
		return "the API is turned on or off at boot"
	case running.API.listen() != next.API.listen():
		return "the API keeps its address until the next boot"
	}
	r, n := running.API, next.API
	r.Cert, r.Key, n.Cert, n.Key = "", "", "", ""
	if sameSection(r, n) {
		return ""
	}
	caPEM, err := n.clientCA()
	if err != nil {
		return err.Error()
	}
	pool, err := clientCAPool(caPEM)
	if err != nil {
		return err.Error()
	}
	if !chainsAsClient(client, pool) {
		return "the API keeps its client CA until the next boot: the certificate this config was sent with " +
			"does not chain to the new client CA, so applying it now would shut this client out (to move " +
			"clients to a new CA, apply both CAs in client_ca first, then the new one alone with a certificate it signed)"
	}
	return ""
}

// sameSection compares two values of a section as the config's JSON does: an empty list, map
// or string and none are the same, as they are in a config file (false and none are not:
// require_signatures' none means its default).
func sameSection(a, b interface{}) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	if errA != nil || errB != nil {
		return reflect.DeepEqual(a, b)
	}
	return emptyJSON(ja) == emptyJSON(jb)
}

func emptyJSON(data []byte) string {
	switch s := string(data); s {
	case "null", "[]", "{}", `""`:
		return ""
	default:
		return s
	}
}

// planConfig says what each section of next does on a machine running running: nothing
// (unchanged), take effect now (applied, and copied into the running config it returns), or
// wait for the next boot (staged, with why). With stagedWhy, nothing takes effect now.
func planConfig(running, next *Config, stagedWhy string, client []*x509.Certificate) ([]sectionResult, *Config) {
	merged := *running
	results := make([]sectionResult, 0, len(configSections))
	for _, s := range configSections {
		r := sectionResult{Section: s.name, Result: sectionUnchanged}
		if !sameSection(s.value(running), s.value(next)) {
			r.Why = stagedWhy
			if r.Why == "" {
				r.Why = s.waitFor(running, next, client)
			}
			r.Result = sectionStaged
			if r.Why == "" && s.set != nil {
				r.Result = sectionApplied
				s.set(&merged, next)
			}
		}
		results = append(results, r)
	}
	return results, &merged
}

// runningConfig is the config the machine runs now: config/machine's, which is the boot's with
// the live sections of every apply since (m.cfg without controllers, not PID 1). Code that reads a
// live section after the boot (upgrades, the health verdict) reads it here. It is the state's:
// never changed in place.
func (m *machine) runningConfig() *Config {
	if m.resources != nil {
		if res, ok := m.resources.Get(machineConfigType, machineConfigID); ok {
			if spec, ok := resource.SpecOf[machineConfigSpec](res); ok && spec.Config != nil {
				return spec.Config
			}
		}
	}
	return m.cfg
}

// keptDir is where a config is kept: STATE's mount point, or "" on a machine without one.
func (m *machine) keptDir() string {
	if m.live.keptDir != "" {
		return m.live.keptDir
	}
	if m.volume().State != "" {
		return stateMount
	}
	return ""
}

// keptConfigReplaced names what the next boot takes its config from instead of the kept one
// (docs/machine-config.md: where machined finds it), "" when the kept one is what it reads.
func (m *machine) keptConfigReplaced() string {
	switch {
	case m.params[paramConfig] != "":
		return paramConfig + "=" + configSourceName(m.params[paramConfig])
	case m.platformGaveConfig():
		return "the platform's user data" // a drive's (nocloud) follows the config drive's rule
	case m.params[paramConfigDrive] == configDriveReplace:
		return paramConfigDrive + "=" + configDriveReplace + " (any config drive there at boot)"
	}
	return ""
}

// platformGaveConfig says whether the running config is the platform's user data, read from
// its metadata service (a drive's, as nocloud's, follows the config drive's rule).
func (m *machine) platformGaveConfig() bool {
	p := m.fetchedPlatform()
	return p != nil && !p.fromConfigDrive && m.configSource == p.name()+":user-data"
}

// ApplyConfig checks req's config, keeps it and publishes its live sections as req.Mode says.
// answer gets the report before anything is published, so the reply is on its way before the
// network changes under it. A refusal is an *apiError, and then nothing was written or applied.
func (m *machine) ApplyConfig(req configRequest, answer func(*configReport)) error {
	doc, err := parseConfig("config", req.Doc, true)
	if err != nil {
		return &apiError{400, err.Error()}
	}
	m.live.applyMu.Lock()
	defer m.live.applyMu.Unlock()
	next := *doc
	m.fillFromPlatformFacts(&next)
	p := m.planApply(&next, req.Mode, req.Client)
	if p.refusal != "" {
		return &apiError{409, p.refusal}
	}
	if req.Mode != applyDryRun {
		path, err := m.keepConfig(doc)
		if err != nil {
			return err
		}
		p.report.Kept = path
	}
	answer(p.report)
	m.con.printf("config: POST /v1/config by %q (%s): %s", req.Who, req.Mode, summarize(p.report.Sections))
	if req.Mode == applyAuto {
		m.publishRunning(p, "POST /v1/config by "+req.Who)
	}
	return nil
}

// fillFromPlatformFacts gives a new config what the boot would give it from the platform's
// facts (hostname, static network), unless those came from a config drive the boot ignored.
func (m *machine) fillFromPlatformFacts(cfg *Config) {
	p := m.fetchedPlatform()
	if p == nil || (p.fromConfigDrive && !m.configDrive.allowed) {
		return
	}
	fillFromPlatform(p, cfg, m.con.printf)
}

// applyPlan is what an apply does: its report, the running config it makes, and whether that
// changes anything live and config/machine's spec; refusal says why the mode cannot be done.
type applyPlan struct {
	report      *configReport
	merged      *Config
	live        bool // some section takes effect now
	specChanged bool // config/machine changes (to report.ConfigVersion)
	refusal     string
}

// planApply plans applying next in mode on this machine.
func (m *machine) planApply(next *Config, mode string, client []*x509.Certificate) applyPlan {
	p := applyPlan{report: &configReport{Mode: mode}}
	stagedWhy := ""
	switch {
	case mode == applyStaged:
		stagedWhy = "mode staged"
	case m.resources == nil:
		stagedWhy = "this machine runs no controllers"
	}
	p.report.Sections, p.merged = planConfig(m.runningConfig(), next, stagedWhy, client)
	for _, r := range p.report.Sections {
		p.live = p.live || r.Result == sectionApplied
	}
	if m.resources != nil {
		p.report.ConfigVersion, p.specChanged = m.configVersionFor(p.merged)
	}
	p.refusal = m.applyRefusal(mode, p.report)
	if mode == applyDryRun && p.refusal != "" {
		p.report.Notes = append(p.report.Notes, "auto and staged would be refused: "+p.refusal)
		p.refusal = ""
	}
	if mode == applyDryRun {
		p.report.Notes = append(p.report.Notes, "dry run: nothing was written or applied")
	}
	return p
}

// applyRefusal says why mode cannot be done here ("" when it can), and notes in report what
// the next boot will do with the sections that wait for it.
func (m *machine) applyRefusal(mode string, report *configReport) string {
	if m.keptDir() == "" {
		return "this machine has no STATE partition (it runs diskless, /var is a tmpfs), so a config " +
			"cannot be kept past a reboot and a live change would be lost at the next one: change the config " +
			"where the machine boots from (kiln.config=, its config drive or its platform's user data)"
	}
	if busy := m.upgradeUnderWay(); busy != "" {
		return busy
	}
	elsewhere := m.keptConfigReplaced()
	if elsewhere == "" {
		return ""
	}
	if mode == applyStaged {
		return "the next boot takes its config from " + elsewhere + ", which replaces the one kept on STATE: " +
			"a staged config would never be used; change the config there"
	}
	for i := range report.Sections {
		if report.Sections[i].Result == sectionStaged {
			report.Sections[i].Result = sectionNotKept
			report.Sections[i].Why = "the next boot takes its config from " + elsewhere
		}
	}
	report.Notes = append(report.Notes, "the next boot takes its config from "+elsewhere+
		" again, which replaces the one kept now: live changes last until then; change the config there to keep them")
	return ""
}

// upgradeUnderWay says why a config cannot be kept while an upgrade runs: the upgrade unmounts
// STATE while it installs.
func (m *machine) upgradeUnderWay() string {
	if s := m.upgrades.snapshot(); s != nil && s.State != upgradeFailed {
		return "an upgrade is " + s.State + "; apply the config once it is over"
	}
	return ""
}

// configVersionFor is the version config/machine has once merged is applied, and whether
// applying changes it: the config controller copies config/applied there, Put raises the
// version only when the spec changes, and after the boot only an apply (under applyMu) changes
// what the controller puts.
func (m *machine) configVersionFor(merged *Config) (uint64, bool) {
	cur, ok := m.resources.Get(machineConfigType, machineConfigID)
	if !ok {
		return 1, true
	}
	old, ok := resource.SpecOf[machineConfigSpec](cur)
	if ok && cur.Phase == resource.Running && reflect.DeepEqual(old, appliedSpec(old, old.Source, merged)) {
		return cur.Version, false
	}
	return cur.Version + 1, true
}

// appliedSpec is config/machine's spec for merged, applied by source over old: the boot's
// problem stays, as the health verdict judges the boot's config.
func appliedSpec(old machineConfigSpec, source string, merged *Config) machineConfigSpec {
	spec := configSpec(source, merged)
	spec.Problem = old.Problem
	return spec
}

// keepConfig writes the config (as the user sent it, before the platform's facts fill it in:
// the next boot fills it again) to STATE, as the config controller does at boot: JSON, 0600, atomically. The
// upgrade lock keeps an upgrade from unmounting STATE meanwhile.
func (m *machine) keepConfig(doc *Config) (string, error) {
	m.upgrades.mu.Lock()
	defer m.upgrades.mu.Unlock()
	if s := m.upgrades.status; s != nil && s.State != upgradeFailed {
		return "", &apiError{409, "an upgrade is " + s.State + "; apply the config once it is over"}
	}
	dir := m.keptDir()
	if dir == stateMount {
		if _, mounted := mountedAt(readMounts(), stateMount); !mounted {
			return "", &apiError{409, "STATE is not mounted (the machine is shutting down or upgrading)"}
		}
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, keptConfigFile)
	if err := persist.WriteFileAtomic(path, data, 0o600); err != nil {
		if errors.Is(err, syscall.ENOSPC) { // the kept config is the old one, whole: nothing applied
			return "", &apiError{http.StatusInsufficientStorage, fmt.Sprintf("keeping the config in %s: STATE is full (%v); nothing was applied or staged", path, err)}
		}
		return "", fmt.Errorf("keeping the config in %s: %v", path, err)
	}
	return path, nil
}

// publishRunning makes the plan's merged config the running one: it puts it as config/applied,
// which the config controller makes config/machine, and waits (a moment: the controllers only
// copy it) until it is there, so the next apply plans against it, and until the API controller
// has put a changed api section in place, so the next request meets it.
func (m *machine) publishRunning(p applyPlan, source string) {
	if !p.live || !p.specChanged {
		return
	}
	res, _ := m.resources.Get(machineConfigType, machineConfigID)
	old, _ := resource.SpecOf[machineConfigSpec](res)
	if _, err := m.resources.Put(appliedOwner, configAppliedType, appliedID, appliedSpec(old, source, p.merged)); err != nil {
		m.con.printf("config: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reached := func(r resource.Resource) bool { return r.Version >= p.report.ConfigVersion }
	if _, err := m.resources.Await(ctx, machineConfigType, machineConfigID, reached); err != nil {
		m.con.printf("config: config/machine has not reached version %d: %v", p.report.ConfigVersion, err)
	}
	for _, r := range p.report.Sections {
		if r.Section != "api" || r.Result != sectionApplied {
			continue
		}
		serves := func(r resource.Resource) bool {
			s, ok := resource.SpecOf[apiStatusSpec](r)
			return ok && s.ConfigVersion >= p.report.ConfigVersion
		}
		if _, err := m.resources.Await(ctx, apiStatusType, apiStatusID, serves); err != nil {
			m.con.printf("config: the API does not serve config version %d yet: %v", p.report.ConfigVersion, err)
		}
	}
}

// configSpec is config/machine's spec for c from source.
func configSpec(source string, c *Config) machineConfigSpec {
	return machineConfigSpec{Source: source, Network: c.Network, Hostname: c.Hostname, TimeServers: c.Time.Servers,
		Services: c.Services, Config: c}
}

// summarize is the console's line of sections: "applied network; staged for the next boot install".
func summarize(results []sectionResult) string {
	var order []string
	by := map[string][]string{}
	for _, r := range results {
		if r.Result == sectionUnchanged {
			continue
		}
		if by[r.Result] == nil {
			order = append(order, r.Result)
		}
		by[r.Result] = append(by[r.Result], r.Section)
	}
	if len(order) == 0 {
		return "nothing changes"
	}
	parts := make([]string, len(order))
	for i, result := range order {
		parts[i] = result + " " + strings.Join(by[result], ", ")
	}
	return strings.Join(parts, "; ")
}
