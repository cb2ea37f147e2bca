package main

// The machine's health: one resource (health/machine), owned by the health controller, that says
// whether the machine does what its config asks, judged from ready on whenever its inputs change
// and at least every second while on trial, every 10 s after. The trial controller makes a trial
// slot the default only once the health has held for a grace period (kiln.trial_grace=, 60 s
// by default): a release
// that reaches ready and then loses its network, whose service crash-loops, or whose machined
// dies within the grace period is never marked good, so GRUB counts the next try.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"kiln/machined/internal/network"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/supervisor"
)

const (
	healthType  resource.Type = "health/machine"
	healthID                  = "machine"
	healthOwner               = "health"

	defaultTrialGrace = 60 * time.Second
	trialHealthEvery  = time.Second      // how often a trial boot's health is judged
	steadyHealthEvery = 10 * time.Second // and every other boot's
	checkTimeout      = 3 * time.Second
	maxHealthChecks   = 16
)

// HealthConfig names the checks of the machine's own that must answer for it to be healthy.
type HealthConfig struct {
	Checks []HealthCheck `json:"checks,omitempty"`
}

// HealthCheck is one check: a TCP port that accepts a connection, or an HTTP(S) URL that
// answers with a 2xx or 3xx status.
type HealthCheck struct {
	TCP  string `json:"tcp,omitempty"`  // HOST:PORT
	HTTP string `json:"http,omitempty"` // http://... or https://...
}

func (h HealthConfig) validate() error {
	if len(h.Checks) > maxHealthChecks {
		return fmt.Errorf("health.checks: %d checks, at most %d", len(h.Checks), maxHealthChecks)
	}
	for i, c := range h.Checks {
		switch {
		case (c.TCP == "") == (c.HTTP == ""):
			return fmt.Errorf("health.checks[%d]: give one of tcp or http", i)
		case c.TCP != "":
			if _, port, err := net.SplitHostPort(c.TCP); err != nil || port == "" {
				return fmt.Errorf("health.checks[%d].tcp %q: want HOST:PORT", i, c.TCP)
			}
		case !strings.HasPrefix(c.HTTP, "http://") && !strings.HasPrefix(c.HTTP, "https://"):
			return fmt.Errorf("health.checks[%d].http %q: want an http:// or https:// URL", i, c.HTTP)
		}
	}
	return nil
}

// healthSpec is the health resource: the verdict, what is wrong, and since when it holds.
type healthSpec struct {
	Healthy  bool      `json:"healthy"`
	Problems []string  `json:"problems,omitempty"`
	Since    time.Time `json:"since"`
}

// healthInputs is what a verdict is made of, gathered from the running machine (or a test).
type healthInputs struct {
	configProblem string
	apiWanted     bool
	apiUp         bool
	network       network.NetworkConfig
	addresses     map[string][]string // interface -> CIDRs the kernel has
	services      []supervisor.ServiceStatus
	checks        []string // the failed checks' messages
	now           time.Time
}

// healthProblems judges the inputs; empty when healthy.
func healthProblems(in healthInputs) []string {
	problems := configAndAPIProblems(in.configProblem, in.apiWanted, in.apiUp)
	problems = append(problems, addressProblems(in.network, in.addresses)...)
	for _, s := range in.services {
		if problem := serviceProblem(s, in.now); problem != "" {
			problems = append(problems, problem)
		}
	}
	return append(problems, in.checks...)
}

// addressProblems: some interface has an address others can reach, and every configured
// interface has its static addresses.
func addressProblems(cfg network.NetworkConfig, addresses map[string][]string) []string {
	var problems []string
	if !anyGlobal(addresses) {
		problems = append(problems, "no interface has an address")
	}
	for _, iface := range cfg.Interfaces {
		have := map[string]bool{}
		for _, cidr := range addresses[iface.Name] {
			have[canonicalCIDR(cidr)] = true
		}
		for _, want := range iface.Addresses {
			if !have[canonicalCIDR(want)] {
				problems = append(problems, fmt.Sprintf("%s lacks its address %s", iface.Name, want))
			}
		}
	}
	return problems
}

// anyGlobal says whether some address is one others can reach: neither loopback nor link-local.
func anyGlobal(addresses map[string][]string) bool {
	for _, cidrs := range addresses {
		for _, cidr := range cidrs {
			if ip, _, err := net.ParseCIDR(cidr); err == nil && ip.IsGlobalUnicast() {
				return true
			}
		}
	}
	return false
}

// canonicalCIDR writes an address/prefix the one way, so 2001:DB8::1/64 equals 2001:db8::1/64.
func canonicalCIDR(cidr string) string {
	ip, ipnet, err := net.ParseCIDR(cidr)
	if err != nil {
		return cidr
	}
	ones, _ := ipnet.Mask.Size()
	return ip.String() + "/" + strconv.Itoa(ones)
}

// steadyAfter is how long a service that has restarted must have run before it counts as
// running again: the supervisor's ResetAfter, after which it forgets the earlier failures too.
// A service that crashes every 25 s is running at almost every look, and is not healthy.
var steadyAfter = supervisor.DefaultOptions().ResetAfter

// serviceProblem: a long-running service runs (steadily, once it has restarted); a oneshot has
// run to its end. "" when the service is healthy.
func serviceProblem(s supervisor.ServiceStatus, now time.Time) string {
	switch {
	case s.State == supervisor.StateExited && s.Type == "oneshot":
		return ""
	case s.State != supervisor.StateRunning:
		return fmt.Sprintf("service %s is %s", s.Name, s.State)
	case s.Restarts > 0 && now.Sub(s.Since) < steadyAfter:
		return fmt.Sprintf("service %s is restarting (%d restarts, up %s of the %s that make it steady)",
			s.Name, s.Restarts, now.Sub(s.Since).Truncate(time.Second), steadyAfter)
	}
	return ""
}

// runChecks tries every check once and says which failed.
func runChecks(ctx context.Context, checks []HealthCheck) []string {
	var failed []string
	for _, c := range checks {
		if err := runCheck(ctx, c); err != nil {
			failed = append(failed, err.Error())
		}
	}
	return failed
}

func runCheck(ctx context.Context, c HealthCheck) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if c.TCP != "" {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", c.TCP)
		if err != nil {
			return fmt.Errorf("check tcp %s: %v", c.TCP, err)
		}
		return conn.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.HTTP, nil)
	if err != nil {
		return fmt.Errorf("check http %s: %v", c.HTTP, err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("check http %s: %v", c.HTTP, err)
	}
	resp.Body.Close()
	if resp.StatusCode >= 400 {
		return fmt.Errorf("check http %s: status %d", c.HTTP, resp.StatusCode)
	}
	return nil
}

// judgeHealth gathers the machine's inputs now and judges them.
func (m *machine) judgeHealth(ctx context.Context) []string {
	cfg := m.runningConfig() // the network and checks a live config change gave, if any
	return healthProblems(healthInputs{
		configProblem: m.configProblem,
		apiWanted:     m.cfg.API.Enabled(),
		apiUp:         m.runningAPI().addr != "",
		network:       cfg.Network,
		addresses:     observedAddresses(m.resources),
		services:      observedServices(m.resources),
		checks:        runChecks(ctx, cfg.Health.Checks),
		now:           time.Now(),
	})
}

// nextHealth is the verdict problems give at now, after prev: Since moves only when the verdict does.
func nextHealth(prev healthSpec, problems []string, now time.Time) healthSpec {
	spec := healthSpec{Healthy: len(problems) == 0, Problems: problems, Since: now}
	if prev.Healthy == spec.Healthy && !prev.Since.IsZero() {
		spec.Since = prev.Since
	}
	return spec
}

// trialGate decides, verdict by verdict, when a trial slot has proved itself: healthy without
// a break for the grace period, before the deadline.
type trialGate struct {
	grace    time.Duration
	deadline time.Time
}

// step says "good" (mark it), "fail" (reboot for the next try) or "" (keep judging).
func (g trialGate) step(h healthSpec, now time.Time) string {
	switch {
	case h.Healthy && !now.Before(h.Since.Add(g.grace)):
		return "good"
	case !now.Before(g.deadline):
		return "fail"
	}
	return ""
}

// trialGrace is how long a trial slot must stay healthy before it is marked good
// (kiln.trial_grace=, seconds).
func trialGrace(params map[string]string) time.Duration {
	if n, err := strconv.Atoi(params[paramTrialGrace]); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	return defaultTrialGrace
}

// healthController keeps health/machine current from the ready line on (machine/ready): it
// judges again whenever what it judges changes (the config, the addresses, the services) and
// at least every interval(): every second while a trial is open, every 10 s otherwise. Between
// judgements it keeps the verdict it has.
type healthController struct {
	judge    func(ctx context.Context) []string
	interval func() time.Duration
	judged   time.Time // when it last judged; only this controller's goroutine touches it
}

func (c *healthController) Name() string { return healthOwner }
func (c *healthController) Inputs() []resource.Type {
	return []resource.Type{readyType, machineConfigType, addressType, serviceType}
}
func (c *healthController) Outputs() []resource.Type { return []resource.Type{healthType} }
func (c *healthController) Every() time.Duration     { return trialHealthEvery }

func (c *healthController) Reconcile(ctx context.Context, r *resource.Run) error {
	if _, ready := r.Get(readyType, readyID); !ready {
		return nil // health is judged from the ready line on
	}
	prev, judged := specAt[healthSpec](r, healthType, healthID)
	now := time.Now()
	if judged && now.Sub(c.judged) < c.interval() {
		return r.Put(healthType, healthID, prev)
	}
	if !judged { // the resource is there from the ready line on, before slow checks answer
		prev = healthSpec{Problems: []string{"not judged yet"}, Since: now}
		if err := r.Put(healthType, healthID, prev); err != nil {
			return err
		}
	}
	c.judged = now
	return r.Put(healthType, healthID, nextHealth(prev, c.judge(ctx), now))
}

// trialController closes a trial from the ready line on: it marks the slot good once the
// health has held for the grace period (trialGate), or reboots for GRUB's next try when the
// deadline passes first. It re-reads the health every second, as the grace period ends with
// time, not with a change.
type trialController struct {
	gate   func() (trialGate, bool) // the trial's gate; false when no trial is open (or before ready)
	good   func(grace time.Duration)
	fail   func(problems []string)
	closed bool // only this controller's goroutine touches it
}

func (c *trialController) Name() string             { return "trial" }
func (c *trialController) Inputs() []resource.Type  { return []resource.Type{healthType} }
func (c *trialController) Outputs() []resource.Type { return nil }
func (c *trialController) Every() time.Duration     { return trialHealthEvery }

func (c *trialController) Reconcile(_ context.Context, r *resource.Run) error {
	if c.closed {
		return nil
	}
	gate, open := c.gate()
	h, judged := specAt[healthSpec](r, healthType, healthID)
	if !open || !judged {
		return nil
	}
	switch gate.step(h, time.Now()) {
	case "good":
		c.closed = true
		c.good(gate.grace)
	case "fail":
		c.closed = true
		problems := h.Problems
		if len(problems) == 0 {
			problems = []string{fmt.Sprintf("it was not healthy for %s on end before the trial's deadline", gate.grace)}
		}
		c.fail(problems)
	}
	return nil
}

// trialGateAt is the gate of this boot's trial, from the ready line on; false when this boot is
// no trial, or is not ready yet. The deadline is the trial timeout from machined's start, and
// never less than the grace plus the network wait from ready, so a slow boot that just made
// ready still gets its full grace period.
func (m *machine) trialGateAt() (trialGate, bool) {
	select {
	case <-m.isReady:
	default:
		return trialGate{}, false
	}
	if m.slots.bootedAs() != "trial" {
		return trialGate{}, false
	}
	grace := trialGrace(m.params)
	deadline := m.started.Add(trialTimeout(m.params))
	if least := m.readyAt.Add(grace + trialNetworkWait(m.params)); deadline.Before(least) {
		deadline = least
	}
	return trialGate{grace: grace, deadline: deadline}, true
}

// healthInterval is how often the health is judged: every second while a trial is open.
func (m *machine) healthInterval() time.Duration {
	if m.slots.bootedAs() == "trial" {
		return trialHealthEvery
	}
	return steadyHealthEvery
}

// markTrialGood makes the trial slot the default and says so.
func (m *machine) markTrialGood(grace time.Duration) {
	if err := m.slots.markGood(m.version); err != nil {
		m.con.printf("boot: slot %s is healthy but could not be made the default: %v", m.slots.slot, err)
	} else if m.slots.markedGood() {
		m.con.printf("boot: slot %s stayed healthy for %s and is the default now", m.slots.slot, grace)
	}
}
