package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kiln/machined/internal/resource"
	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit/wait"
)

// hostnames records what the hostname controller sets, and says when it sets one.
type hostnames struct {
	mu      sync.Mutex
	set     []string
	changed chan struct{} // a token after each set
}

func newHostnames() *hostnames { return &hostnames{changed: make(chan struct{}, 1)} }

func (h *hostnames) record(name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.set = append(h.set, name)
	select {
	case h.changed <- struct{}{}:
	default:
	}
	return nil
}

func (h *hostnames) last() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.set) == 0 {
		return ""
	}
	return h.set[len(h.set)-1]
}

// waitFor waits until the last hostname set is name.
func (h *hostnames) waitFor(t *testing.T, name string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for h.last() != name {
		select {
		case <-h.changed:
		case <-timeout:
			t.Fatalf("the hostname controller set %q, never %q", h.last(), name)
		}
	}
}

// bootedConfig is the config the test machines boot with: a drive's, with a static address,
// a service and upgrades allowed only with release keys.
const bootedConfig = `hostname: node-1
install: {disk: /dev/vda}
network:
  interfaces:
    - {name: eth0, addresses: [10.0.2.50/24], dhcp: false}
services:
  - {name: web, command: /bin/web}
`

// configMachine is a machine that booted on bootedConfig from a config drive, with its
// controllers running (the network a recorder) and STATE in a directory of the test's.
type configMachine struct {
	*machine
	net       *applyRecorder
	hostnames *hostnames
	kept      string // STATE's config.json
	api       *authAPI
}

// newConfigMachine starts one; adjust changes the machine before its API serves.
func newConfigMachine(t *testing.T, adjust ...func(m *machine)) *configMachine {
	t.Helper()
	cfg, err := parseConfig("kiln.yaml", []byte(bootedConfig), true)
	if err != nil {
		t.Fatal(err)
	}
	c := &configMachine{net: &applyRecorder{}, hostnames: newHostnames()}
	c.machine = &machine{con: quietConsole(), cfg: cfg, configSource: "/dev/sr0:kiln.yaml", params: map[string]string{}}
	c.live.keptDir = t.TempDir()
	c.live.setHostname = c.hostnames.record
	c.kept = filepath.Join(c.live.keptDir, keptConfigFile)
	for _, f := range adjust {
		f(c.machine)
	}
	c.startControllers(c.net)
	c.waitNetwork(c.awaitConfig(), 5*time.Second)
	c.awaitExtensions() // as the boot does before the API starts
	c.api = serveAuthAPI(t, defaultAPILimits, c.machine)
	return c
}

// post sends POST /v1/config as role and returns the code, the report (on 200) and the error.
func (c *configMachine) post(t *testing.T, role, query, body string) (int, configReport, string) {
	t.Helper()
	return c.postWith(t, c.api.client(t, role), query, body)
}

// postWith sends POST /v1/config with client, as post does.
func (c *configMachine) postWith(t *testing.T, client *http.Client, query, body string) (int, configReport, string) {
	t.Helper()
	resp, err := client.Post(c.api.url+"/v1/config"+query, "application/yaml", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var report configReport
	var refusal struct {
		Error string `json:"error"`
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(data, &report); err != nil {
			t.Fatalf("the report is not JSON: %v\n%s", err, data)
		}
	} else {
		_ = json.Unmarshal(data, &refusal)
	}
	return resp.StatusCode, report, refusal.Error
}

func (c *configMachine) configVersion(t *testing.T) uint64 {
	t.Helper()
	res, ok := c.resources.Get(machineConfigType, machineConfigID)
	if !ok {
		t.Fatal("no config/machine")
	}
	return res.Version
}

// nothingKept fails the test if a config was written to STATE.
func (c *configMachine) nothingKept(t *testing.T) {
	t.Helper()
	entries, err := os.ReadDir(c.live.keptDir)
	if err != nil || len(entries) != 0 {
		t.Fatalf("STATE holds %v (%v); nothing may be written", entries, err)
	}
}

func results(report configReport) map[string]string {
	out := map[string]string{}
	for _, s := range report.Sections {
		out[s.Section] = s.Result
	}
	return out
}

// sectionOf is one section's result in a report (a zero one when the report lacks it).
func sectionOf(report configReport, name string) sectionResult {
	for _, s := range report.Sections {
		if s.Section == name {
			return s
		}
	}
	return sectionResult{}
}

// waitNetworkApplied waits for network/status to reach version (a real condition, watched).
func (c *configMachine) waitNetworkApplied(t *testing.T, version uint64) {
	t.Helper()
	c.waitUntil(t, networkStatusType, networkStatusID, fmt.Sprintf("config version %d", version), func(res resource.Resource) bool {
		spec, _ := resource.SpecOf[networkStatusSpec](res)
		return spec.ConfigVersion >= version
	})
}

// waitUntil waits, watching it, until the resource typ/id exists and reached says so of it.
func (c *configMachine) waitUntil(t *testing.T, typ resource.Type, id, what string, reached func(resource.Resource) bool) {
	t.Helper()
	w := c.resources.Watch(typ, id)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if res, ok := c.resources.Get(typ, id); ok && reached(res) {
			return
		}
		if _, err := w.Next(ctx); err != nil {
			t.Fatalf("%s/%s never reached %s", typ, id, what)
		}
	}
}

const appliedConfig = `hostname: node-2
install: {disk: /dev/vdb}
network:
  interfaces:
    - {name: eth0, addresses: [10.0.2.60/24], dhcp: false}
services:
  - {name: web, command: /bin/web, args: [--fast]}
allow_unsigned: true
`

// Only an admin may apply a config; a reader's or an operator's request writes nothing.
func TestApplyConfigNeedsAdmin(t *testing.T) {
	c := newConfigMachine(t)
	for _, role := range []string{"reader", "operator"} {
		code, _, msg := c.post(t, role, "", appliedConfig)
		if code != http.StatusForbidden || !strings.Contains(msg, "it needs admin") {
			t.Errorf("%s: %d %q, want 403", role, code, msg)
		}
	}
	c.nothingKept(t)
	if code, _, msg := c.post(t, "admin", "", appliedConfig); code != http.StatusOK {
		t.Fatalf("admin: %d %s", code, msg)
	}
}

// A config past the bound is refused with 413 whether it says its length or not.
func TestApplyConfigRefusesAnOversizeBody(t *testing.T) {
	c := newConfigMachine(t)
	big := "hostname: node-2\n# " + strings.Repeat("x", maxConfigBody) + "\n"
	if code, _, msg := c.post(t, "admin", "", big); code != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "larger than") {
		t.Errorf("with a length: %d %q", code, msg)
	}
	req, _ := http.NewRequest(http.MethodPost, c.api.url+"/v1/config", io.MultiReader(strings.NewReader(big)))
	req.ContentLength = -1 // chunked: the bound is met while reading
	resp, err := c.api.client(t, "admin").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked: %d", resp.StatusCode)
	}
	c.nothingKept(t)
}

// A config the boot's parser refuses is a 400 naming the field or line, and nothing is kept,
// published or applied.
func TestApplyConfigRefusesAnInvalidConfig(t *testing.T) {
	c := newConfigMachine(t)
	before := c.configVersion(t)
	_, applies := c.net.last()
	for body, why := range map[string]string{
		"hostnme: node-2\n":                 `unknown field "hostnme"`,
		"hostname: -bad-\n":                 `hostname "-bad-" is not a valid host name`,
		"network:\n\tinterfaces: []\n":      "config:2:",
		"time: {servers: [\"a b\"]}\n":      "time.servers[0]",
		"services: [{name: x, command: y}]": "services[0]",
	} {
		code, _, msg := c.post(t, "admin", "", body)
		if code != http.StatusBadRequest || !strings.Contains(msg, why) {
			t.Errorf("%q: %d %q, want 400 saying %q", body, code, msg, why)
		}
	}
	if code, _, msg := c.post(t, "admin", "?mode=now", appliedConfig); code != http.StatusBadRequest || !strings.Contains(msg, "auto, staged or dry_run") {
		t.Errorf("an unknown mode: %d %q", code, msg)
	}
	c.nothingKept(t)
	if v := c.configVersion(t); v != before {
		t.Errorf("config/machine went from version %d to %d", before, v)
	}
	if _, n := c.net.last(); n != applies {
		t.Errorf("the network was applied again")
	}
}

// auto: the config is kept on STATE, the live sections reach their controllers (config/machine's
// version goes up, the network controller applies the new network, the hostname is set, the
// upgrade policy changes at once) and the others wait for the next boot.
func TestApplyConfigAutoAppliesLiveAndStagesTheRest(t *testing.T) {
	c := newConfigMachine(t)
	before := c.configVersion(t)
	if err := c.upgradePolicy(); err == nil {
		t.Fatal("the booted config allows upgrades")
	}
	code, report, msg := c.post(t, "admin", "", appliedConfig)
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, msg)
	}
	want := map[string]string{"hostname": sectionApplied, "network": sectionApplied, "allow_unsigned": sectionApplied,
		"install": sectionStaged, "services": sectionApplied, "api": sectionUnchanged, "time": sectionUnchanged,
		"registries": sectionUnchanged, "release_keys": sectionUnchanged, "require_signatures": sectionUnchanged,
		"health": sectionUnchanged}
	if got := results(report); !reflect.DeepEqual(got, want) {
		t.Errorf("sections %v\nwant %v", got, want)
	}
	if report.Mode != applyAuto || report.Kept != c.kept || report.ConfigVersion != before+1 {
		t.Errorf("report %+v (config/machine was at %d)", report, before)
	}
	c.waitNetworkApplied(t, report.ConfigVersion)
	if cfg, _ := c.net.last(); !reflect.DeepEqual(cfg, staticConfig("10.0.2.60/24")) {
		t.Errorf("the network controller applied %+v", cfg)
	}
	if v := c.configVersion(t); v != report.ConfigVersion {
		t.Errorf("config/machine is at %d, the report says %d", v, report.ConfigVersion)
	}
	c.hostnames.waitFor(t, "node-2")
	kept, err := os.ReadFile(c.kept)
	if err != nil {
		t.Fatal(err)
	}
	if cfg, err := parseConfig("config.json", kept, true); err != nil || cfg.Hostname != "node-2" || cfg.Install.Disk != "/dev/vdb" {
		t.Errorf("kept %s (%v)", kept, err)
	}
	if info, _ := os.Stat(c.kept); info.Mode().Perm() != 0o600 {
		t.Errorf("kept with mode %v: it holds the API's key", info.Mode())
	}
	running := c.runningConfig()
	if running.Hostname != "node-2" || running.Install.Disk != "/dev/vda" || strings.Join(running.Services[0].Args, " ") != "--fast" {
		t.Errorf("running config %+v: the live sections new, the others as booted", running)
	}
	if err := c.upgradePolicy(); err != nil {
		t.Errorf("allow_unsigned applied live, yet: %v", err)
	}
}

// staged: the config is kept and nothing is published or applied.
func TestApplyConfigStagedOnlyKeeps(t *testing.T) {
	c := newConfigMachine(t)
	before := c.configVersion(t)
	_, applies := c.net.last()
	code, report, msg := c.post(t, "admin", "?mode=staged", appliedConfig)
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, msg)
	}
	for _, s := range report.Sections {
		changed := s.Section == "hostname" || s.Section == "install" || s.Section == "network" || s.Section == "services" || s.Section == "allow_unsigned"
		if changed != (s.Result == sectionStaged) || (changed && s.Why != "mode staged") {
			t.Errorf("%+v", s)
		}
	}
	if _, err := os.Stat(c.kept); err != nil || report.Kept != c.kept {
		t.Errorf("not kept: %v %q", err, report.Kept)
	}
	if v := c.configVersion(t); v != before || report.ConfigVersion != before {
		t.Errorf("config/machine at %d, reported %d, was %d", v, report.ConfigVersion, before)
	}
	if _, n := c.net.last(); n != applies {
		t.Error("the network was applied")
	}
	if c.runningConfig().Hostname != "node-1" {
		t.Error("the running config changed")
	}
}

// dry_run reports what auto would do and writes and applies nothing.
func TestApplyConfigDryRunWritesNothing(t *testing.T) {
	c := newConfigMachine(t)
	before := c.configVersion(t)
	code, report, msg := c.post(t, "admin", "?mode=dry_run", appliedConfig)
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, msg)
	}
	if got := results(report); got["network"] != sectionApplied || got["install"] != sectionStaged {
		t.Errorf("sections %v", got)
	}
	if report.Kept != "" || report.ConfigVersion != before+1 || !strings.Contains(strings.Join(report.Notes, "\n"), "dry run") {
		t.Errorf("report %+v", report)
	}
	c.nothingKept(t)
	if v := c.configVersion(t); v != before {
		t.Errorf("config/machine went to %d", v)
	}
	if c.runningConfig().Hostname != "node-1" || c.hostnames.last() == "node-2" {
		t.Error("the dry run applied the hostname")
	}
}

// A full STATE (a real tmpfs of 64 KiB, filled): the apply is refused with 507, nothing is applied
// or staged, and the kept config is the old one, whole. Once there is room, the same apply works.
func TestApplyConfigOnAFullStateAppliesNothing(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (mounts a tmpfs)")
	}
	var filler string
	c := newConfigMachine(t, func(m *machine) {
		dir := m.live.keptDir
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
		if err := os.WriteFile(filepath.Join(dir, keptConfigFile), []byte(bootedConfig), 0o600); err != nil {
			t.Fatal(err)
		}
		filler = filepath.Join(dir, "filler")
		f, err := os.Create(filler)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for block := make([]byte, 4096); ; {
			if _, err := f.Write(block); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatal(err)
				}
				break
			}
		}
	})
	before := c.configVersion(t)
	_, applies := c.net.last()
	code, _, msg := c.post(t, "admin", "", appliedConfig)
	if code != http.StatusInsufficientStorage || !strings.Contains(msg, "STATE is full") || !strings.Contains(msg, "no space left") {
		t.Fatalf("%d %q", code, msg)
	}
	if kept, err := os.ReadFile(c.kept); err != nil || string(kept) != bootedConfig {
		t.Errorf("the kept config is now %q (%v)", kept, err)
	}
	if v := c.configVersion(t); v != before {
		t.Errorf("config/machine went to %d", v)
	}
	if _, n := c.net.last(); n != applies || c.runningConfig().Hostname != "node-1" || c.hostnames.last() == "node-2" {
		t.Error("something was applied")
	}
	entries, _ := os.ReadDir(filepath.Dir(c.kept))
	if len(entries) != 2 {
		t.Errorf("left behind in STATE: %v", entries) // the kept config and the filler, no temporary file
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if code, report, msg := c.post(t, "admin", "", appliedConfig); code != http.StatusOK || report.ConfigVersion != before+1 {
		t.Fatalf("with room again: %d %q %+v", code, msg, report)
	}
	c.hostnames.waitFor(t, "node-2")
}

// The same config again changes nothing: every section unchanged, no new version.
func TestApplyConfigTheSameConfigChangesNothing(t *testing.T) {
	c := newConfigMachine(t)
	before := c.configVersion(t)
	code, report, _ := c.post(t, "admin", "", bootedConfig)
	if code != http.StatusOK {
		t.Fatal(code)
	}
	for _, s := range report.Sections {
		if s.Result != sectionUnchanged {
			t.Errorf("%+v", s)
		}
	}
	if report.ConfigVersion != before || c.configVersion(t) != before {
		t.Errorf("version %d, reported %d, was %d", c.configVersion(t), report.ConfigVersion, before)
	}
}

// A diskless machine refuses auto and staged (nothing could outlive a reboot); a dry run says so.
func TestApplyConfigOnADisklessMachine(t *testing.T) {
	c := newConfigMachine(t, func(m *machine) { m.live.keptDir = "" })
	for _, mode := range []string{"", "?mode=staged"} {
		code, _, msg := c.post(t, "admin", mode, appliedConfig)
		if code != http.StatusConflict || !strings.Contains(msg, "no STATE partition") {
			t.Errorf("%q: %d %q, want 409", mode, code, msg)
		}
	}
	code, report, _ := c.post(t, "admin", "?mode=dry_run", appliedConfig)
	if code != http.StatusOK || !strings.Contains(strings.Join(report.Notes, "\n"), "would be refused: this machine has no STATE partition") {
		t.Errorf("dry run: %d %+v", code, report)
	}
	if c.runningConfig().Hostname != "node-1" {
		t.Error("applied on a diskless machine")
	}
}

// A machine whose every boot reads kiln.config= refuses staged (it would never be used) and
// says in auto that the waiting sections will not be kept.
func TestApplyConfigWhenTheNextBootReadsAnotherConfig(t *testing.T) {
	c := newConfigMachine(t, func(m *machine) { m.params[paramConfig] = "https://user:pw@config.example/kiln.yaml?token=x" })
	code, _, msg := c.post(t, "admin", "?mode=staged", appliedConfig)
	if code != http.StatusConflict || !strings.Contains(msg, "kiln.config=https://REDACTED@config.example/kiln.yaml?REDACTED") {
		t.Errorf("staged: %d %q", code, msg)
	}
	code, report, _ := c.post(t, "admin", "", appliedConfig)
	if got := results(report); code != http.StatusOK || got["network"] != sectionApplied || got["install"] != sectionNotKept {
		t.Errorf("auto: %d %v", code, got)
	}
	if !strings.Contains(strings.Join(report.Notes, "\n"), "live changes last until then") {
		t.Errorf("notes %q", report.Notes)
	}
}

// While an upgrade runs (it unmounts STATE to install) a config is refused.
func TestApplyConfigWaitsForAnUpgrade(t *testing.T) {
	c := newConfigMachine(t, func(m *machine) { m.upgrades.status = &upgradeStatus{State: upgradeInstalling} })
	if code, _, msg := c.post(t, "admin", "", appliedConfig); code != http.StatusConflict || !strings.Contains(msg, "an upgrade is installing") {
		t.Errorf("%d %q", code, msg)
	}
	c.nothingKept(t)
}

// The sections compare as the config's JSON does: an empty list is none.
func TestPlanConfigComparesSectionsAsJSON(t *testing.T) {
	running := &Config{Hostname: "a", Services: nil, Time: TimeConfig{Servers: []string{}}}
	next := &Config{Hostname: "a", Services: []supervisor.ServiceSpec{}, Time: TimeConfig{Disabled: true}}
	got, merged := planConfig(running, next, "", nil)
	want := map[string]string{}
	for _, s := range got {
		want[s.Section] = s.Result
	}
	if want["services"] != sectionUnchanged || want["time"] != sectionStaged || want["hostname"] != sectionUnchanged {
		t.Errorf("%+v", got)
	}
	if merged.Time.Disabled {
		t.Error("a staged section reached the running config")
	}
	if summarize(got) != "staged for the next boot time" || summarize(nil) != "nothing changes" {
		t.Errorf("summary %q", summarize(got))
	}
}

// Every top-level field of the config is a section an apply reports, so a field added to Config
// cannot change unnoticed; version is the document's, not the machine's.
func TestEveryConfigFieldIsASection(t *testing.T) {
	var fields []string
	typ := reflect.TypeOf(Config{})
	for i := 0; i < typ.NumField(); i++ {
		if name := strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]; name != "version" {
			fields = append(fields, name)
		}
	}
	var sections []string
	for _, s := range configSections {
		sections = append(sections, s.name)
	}
	sort.Strings(fields)
	sort.Strings(sections)
	if !reflect.DeepEqual(fields, sections) {
		t.Errorf("config fields %v, sections %v", fields, sections)
	}
	no, yes := false, true
	if sameSection((*bool)(nil), &no) || !sameSection((*bool)(nil), (*bool)(nil)) || sameSection(&no, &yes) {
		t.Error("require_signatures: none, false and true are three settings")
	}
}

// Where the next boot's config comes from: the kept one, unless the command line or a platform's
// user data (not a drive's, which a kept config outranks) gives another.
func TestKeptConfigReplacedAtTheNextBoot(t *testing.T) {
	aws, nocloud := mustLookup(t, "aws"), mustLookup(t, "nocloud")
	for _, c := range []struct {
		m    *machine
		want string
	}{
		{&machine{params: map[string]string{}, configSource: "/dev/sr0:kiln.json"}, ""},
		{&machine{params: map[string]string{paramConfig: "/etc/kiln.yaml"}}, "kiln.config=/etc/kiln.yaml"},
		{withPlatform(t, &machine{params: map[string]string{}, configSource: "aws:user-data"}, &platformState{impl: aws}), "the platform's user data"},
		{withPlatform(t, &machine{params: map[string]string{}, configSource: "nocloud:user-data"}, &platformState{impl: nocloud, fromConfigDrive: true}), ""},
		{&machine{params: map[string]string{paramConfigDrive: "replace"}}, "kiln.config.drive=replace (any config drive there at boot)"},
	} {
		if got := c.m.keptConfigReplaced(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.m.params, got, c.want)
		}
	}
}

// presented is the common name of the certificate the API shows a new connection.
func (c *configMachine) presented(t *testing.T) string {
	t.Helper()
	resp, err := c.api.client(t, "reader").Get(c.api.url + "/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.TLS.PeerCertificates[0].Subject.CommonName
}

// runAs makes cfg the running config, as an earlier apply would have: config/applied, which
// the config controller makes config/machine.
func (c *configMachine) runAs(t *testing.T, cfg *Config) {
	t.Helper()
	res, _ := c.resources.Get(machineConfigType, machineConfigID)
	old, _ := resource.SpecOf[machineConfigSpec](res)
	if _, err := c.resources.Put(appliedOwner, configAppliedType, appliedID, appliedSpec(old, old.Source, cfg)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the config controller's copy of config/applied", 5*time.Second, func() bool { return c.runningConfig() == cfg })
}

// newAPIConfigMachine is a config machine whose running config has the API its test server
// serves, and whose API controller has started that server (as it would a real one: the boot
// starts the services), so it follows the config (live applies reach that server's TLS); and
// that api section.
func newAPIConfigMachine(t *testing.T) (*configMachine, APIConfig) {
	t.Helper()
	c := newConfigMachine(t)
	booted := APIConfig{ClientCA: c.api.clientCA.pem, Cert: c.api.machine.certPEM, Key: c.api.machine.keyPEM}
	running := *c.cfg
	running.API = booted
	c.runAs(t, &running)
	c.live.serveAPI = func(APIConfig) (*apiServer, error) { return c.api.server, nil }
	c.startServices()
	t.Cleanup(func() { c.stopServices("test") })
	c.awaitAPI()
	wait.Until(t, "api/status", 5*time.Second, func() bool { return len(c.Resources("api")) == 1 })
	return c, booted
}

// Clients move to a new CA without a reboot: both CAs applied live (sent with a certificate of
// the old one, which chains to the pair), then the new one alone (sent with a certificate it
// signed). After the first a client of the new CA gets in; after the second a client of the old
// one is refused at the handshake. A CA the sender's certificate does not chain to is staged.
func TestClientsMoveToANewClientCAWithoutAReboot(t *testing.T) {
	c, booted := newAPIConfigMachine(t)
	newCA := newTestCA(t, "new clients CA")
	admin := certSpec{name: "admin-2", orgs: []string{"admin"}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	newAdmin, oldAdmin := clientWith(t, c.api.serverCA, newCA.issueSpec(t, admin)), c.api.client(t, "admin")
	getsIn := func(client *http.Client) bool {
		client.CloseIdleConnections() // a new handshake each time
		resp, err := client.Get(c.api.url + "/v1/status")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	if getsIn(newAdmin) || !getsIn(oldAdmin) {
		t.Fatal("before: only the old CA's clients get in")
	}

	both := booted
	both.ClientCA = c.api.clientCA.pem + newCA.pem
	if code, report, msg := c.postWith(t, oldAdmin, "", withAPI(t, both)); code != http.StatusOK || sectionOf(report, "api").Result != sectionApplied {
		t.Fatalf("both CAs: %d %s %+v", code, msg, sectionOf(report, "api"))
	}
	if !getsIn(newAdmin) || !getsIn(oldAdmin) {
		t.Fatal("with both CAs, clients of both get in")
	}

	// sent by a client of the old CA, the new CA alone would shut it out: staged, nothing changes
	only := booted
	only.ClientCA = newCA.pem
	code, report, msg := c.postWith(t, oldAdmin, "", withAPI(t, only))
	if section := sectionOf(report, "api"); code != http.StatusOK || section.Result != sectionStaged || !strings.Contains(section.Why, "shut this client out") {
		t.Fatalf("new CA alone from an old client: %d %s %+v", code, msg, section)
	}
	if !getsIn(oldAdmin) {
		t.Fatal("a staged client CA was put in place")
	}

	if code, report, msg := c.postWith(t, newAdmin, "", withAPI(t, only)); code != http.StatusOK || sectionOf(report, "api").Result != sectionApplied {
		t.Fatalf("new CA alone from a new client: %d %s %+v", code, msg, sectionOf(report, "api"))
	}
	if !getsIn(newAdmin) || getsIn(oldAdmin) {
		t.Fatal("after the move only the new CA's clients get in")
	}
}

// withAPI is bootedConfig as JSON with an api section.
func withAPI(t *testing.T, api APIConfig) string {
	t.Helper()
	doc := map[string]interface{}{
		"hostname": "node-1", "install": map[string]string{"disk": "/dev/vda"},
		"network": map[string]interface{}{"interfaces": []map[string]interface{}{
			{"name": "eth0", "addresses": []string{"10.0.2.50/24"}, "dhcp": false}}},
		"services": []map[string]string{{"name": "web", "command": "/bin/web"}},
		"api":      api,
	}
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// A new certificate and key for the machine take effect at once (a leaked machine key is
// replaced without a reboot): new connections get the new certificate, the old key is no longer
// the machine's. A client CA the sender's certificate does not chain to, or a new address, waits
// for the next boot, saying why.
func TestAnAPICertificateAppliedLiveIsServedAtOnce(t *testing.T) {
	c, booted := newAPIConfigMachine(t)
	if got := c.presented(t); got != "machine" {
		t.Fatalf("before: %q", got)
	}

	fresh := c.api.serverCA.issueSpec(t, certSpec{name: "machine-2", usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, server: true})
	rotated := booted
	rotated.Cert, rotated.Key = fresh.certPEM, fresh.keyPEM
	code, report, msg := c.post(t, "admin", "", withAPI(t, rotated))
	if code != http.StatusOK || sectionOf(report, "api").Result != sectionApplied {
		t.Fatalf("%d %s %+v", code, msg, report)
	}
	if got := c.presented(t); got != "machine-2" {
		t.Fatalf("after the apply the API presents %q", got)
	}
	if !bytes.Equal(c.api.server.tls.serverKey(), fresh.cert.RawSubjectPublicKeyInfo) {
		t.Error("the machine's own key, which no client may use, is still the old one")
	}
	// api/status (kiln node get api) says which certificate is served, for which config version
	if got, ok := c.Resources("api")[0].Spec.(apiStatusSpec); !ok || !strings.Contains(got.Certificate, `"machine-2"`) ||
		got.ConfigVersion != report.ConfigVersion || "https://"+got.Address != c.api.url || got.Problem != "" {
		t.Errorf("api/status: %+v (config version %d)", c.Resources("api")[0].Spec, report.ConfigVersion)
	}

	otherCA := newTestCA(t, "another clients CA")
	for what, api := range map[string]APIConfig{
		"client CA": {ClientCA: otherCA.pem, Cert: fresh.certPEM, Key: fresh.keyPEM},
		"address":   {Listen: "127.0.0.1:50001", ClientCA: booted.ClientCA, Cert: fresh.certPEM, Key: fresh.keyPEM},
	} {
		code, report, msg := c.post(t, "admin", "", withAPI(t, api))
		section := sectionOf(report, "api")
		if code != http.StatusOK || section.Result != sectionStaged || !strings.Contains(section.Why, "until the next boot") {
			t.Errorf("%s: %d %s %+v", what, code, msg, section)
		}
	}
	if got := c.presented(t); got != "machine-2" {
		t.Fatalf("a staged api section changed the certificate: %q", got)
	}
}
