package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/machined/internal/network"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit/wait"
)

func healthyInputs() healthInputs {
	return healthInputs{
		apiWanted: true,
		apiUp:     true,
		network: network.NetworkConfig{Interfaces: []network.InterfaceConfig{
			{Name: "eth0", Addresses: []string{"10.0.2.77/24", "2001:DB8::7/64"}},
		}},
		addresses: map[string][]string{"eth0": {"10.0.2.77/24", "2001:db8::7/64", "fe80::1/64"}},
		services: []supervisor.ServiceStatus{
			{Name: "lldpd", State: supervisor.StateRunning},
			{Name: "setup", State: supervisor.StateExited, Type: "oneshot"},
		},
		now: time.Unix(1_000_000, 0),
	}
}

func TestHealthyWhenEverythingTheConfigAsksForIsThere(t *testing.T) {
	if got := healthProblems(healthyInputs()); len(got) != 0 {
		t.Fatalf("problems: %v", got)
	}
	// a service that restarted once but has run steadily since is healthy
	in := healthyInputs()
	in.services[0].Restarts, in.services[0].Since = 1, in.now.Add(-steadyAfter)
	if got := healthProblems(in); len(got) != 0 {
		t.Fatalf("problems: %v", got)
	}
}

func TestHealthNamesEachProblem(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(*healthInputs)
		want   string
	}{
		{"config", func(in *healthInputs) { in.configProblem = "kept: bad yaml" }, "its config could not be used (kept: bad yaml)"},
		{"api", func(in *healthInputs) { in.apiUp = false }, "the API the config asks for did not start"},
		{"no address", func(in *healthInputs) {
			in.network = network.NetworkConfig{}
			in.addresses = map[string][]string{"eth0": {"fe80::1/64"}}
		}, "no interface has an address"},
		{"static missing", func(in *healthInputs) { in.addresses["eth0"] = []string{"10.0.2.15/24", "2001:db8::7/64"} }, "eth0 lacks its address 10.0.2.77/24"},
		{"crash loop", func(in *healthInputs) { in.services[0].State = supervisor.StateBackoff }, "service lldpd is backoff"},
		{"waiting", func(in *healthInputs) { in.services[0].State = supervisor.StateWaiting }, "service lldpd is waiting"},
		{"long-running exited", func(in *healthInputs) { in.services[1].Type = "simple" }, "service setup is exited"},
		{"check", func(in *healthInputs) { in.checks = []string{"check tcp 127.0.0.1:9: refused"} }, "check tcp 127.0.0.1:9: refused"},
		// running at this look, but it crashed 10 s ago: a crash loop caught between two crashes
		{"running between crashes", func(in *healthInputs) {
			in.services[0].Restarts, in.services[0].Since = 3, in.now.Add(-10*time.Second)
		}, "service lldpd is restarting (3 restarts, up 10s of the 30s that make it steady)"},
	}
	for _, c := range cases {
		in := healthyInputs()
		c.break_(&in)
		got := healthProblems(in)
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("%s: %q, want [%q]", c.name, got, c.want)
		}
	}
}

func TestHealthConfigIsValidated(t *testing.T) {
	good := HealthConfig{Checks: []HealthCheck{{TCP: "127.0.0.1:22"}, {TCP: "[::1]:80"}, {HTTP: "http://127.0.0.1:8080/healthz"}}}
	if err := good.validate(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]HealthConfig{
		"one of tcp or http": {Checks: []HealthCheck{{}}},
		"give one of":        {Checks: []HealthCheck{{TCP: "a:1", HTTP: "http://a"}}},
		"want HOST:PORT":     {Checks: []HealthCheck{{TCP: "localhost"}}},
		"want an http":       {Checks: []HealthCheck{{HTTP: "file:///etc/passwd"}}},
		"at most 16":         {Checks: make([]HealthCheck, 17)},
	}
	for want, h := range bad {
		if err := h.validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want %q", h, err, want)
		}
	}
	if _, err := parseConfig("c.yaml", []byte("health:\n  checks:\n    - tcp: nohost\n"), true); err == nil ||
		!strings.Contains(err.Error(), "health.checks[0].tcp") {
		t.Fatalf("parseConfig: %v", err)
	}
}

func TestChecksAnswerOrSayWhy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedAddr := closed.Addr().String()
	closed.Close()
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/bad" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer ok.Close()
	checks := []HealthCheck{{TCP: ln.Addr().String()}, {HTTP: ok.URL + "/healthz"}, {TCP: closedAddr}, {HTTP: ok.URL + "/bad"}}
	got := runChecks(context.Background(), checks)
	if len(got) != 2 || !strings.HasPrefix(got[0], "check tcp "+closedAddr) || got[1] != "check http "+ok.URL+"/bad: status 503" {
		t.Fatalf("failed checks: %q", got)
	}
}

func TestTheTrialGateOpensAfterAnUnbrokenGracePeriod(t *testing.T) {
	start := time.Unix(1000, 0)
	gate := trialGate{grace: 60 * time.Second, deadline: start.Add(10 * time.Minute)}
	healthy := healthSpec{Healthy: true, Since: start}
	if got := gate.step(healthy, start.Add(59*time.Second)); got != "" {
		t.Fatalf("before the grace period: %q", got)
	}
	if got := gate.step(healthy, start.Add(60*time.Second)); got != "good" {
		t.Fatalf("after it: %q", got)
	}
	// a break restarts the period: healthy again since 9.5 min, the deadline comes first
	again := healthSpec{Healthy: true, Since: start.Add(9*time.Minute + 30*time.Second)}
	if got := gate.step(again, start.Add(9*time.Minute+59*time.Second)); got != "" {
		t.Fatalf("within the new period: %q", got)
	}
	if got := gate.step(again, start.Add(10*time.Minute)); got != "fail" {
		t.Fatalf("at the deadline: %q", got)
	}
	if got := gate.step(healthSpec{Since: start}, start.Add(10*time.Minute)); got != "fail" {
		t.Fatalf("unhealthy at the deadline: %q", got)
	}
}

func TestTrialGrace(t *testing.T) {
	if got := trialGrace(map[string]string{}); got != defaultTrialGrace {
		t.Fatalf("default: %v", got)
	}
	if got := trialGrace(map[string]string{paramTrialGrace: "0"}); got != 0 {
		t.Fatalf("0: %v", got)
	}
	if got := trialGrace(map[string]string{paramTrialGrace: "soon"}); got != defaultTrialGrace {
		t.Fatalf("soon: %v", got)
	}
}

func TestHealthKeepsItsSinceWhileTheVerdictHolds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	sick := nextHealth(healthSpec{}, []string{"no interface has an address"}, t0)
	first := nextHealth(sick, nil, t0.Add(time.Second))
	second := nextHealth(first, nil, t0.Add(2*time.Second))
	if sick.Healthy || !first.Healthy || !second.Since.Equal(t0.Add(time.Second)) {
		t.Fatalf("since moved while healthy: %+v then %+v then %+v", sick, first, second)
	}
	if again := nextHealth(second, []string{"x"}, t0.Add(3*time.Second)); again.Healthy || !again.Since.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("a new verdict keeps the old since: %+v", again)
	}
}

// judgeCounter stands in for the health's inputs (machine.judgeHealth reads the addresses and
// services the observers put, and runs the config's checks; the e2e trials judge real ones).
type judgeCounter struct {
	mu       sync.Mutex
	calls    int
	problems []string
}

func (j *judgeCounter) judge(context.Context) []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls++
	return j.problems
}

func (j *judgeCounter) count() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.calls
}

// The health controller judges from the ready line on, keeps its verdict between judgements,
// and judges no more often than its interval whatever its inputs do.
func TestTheHealthControllerJudgesFromReadyOnAtItsPace(t *testing.T) {
	state := resource.NewState()
	for typ, owner := range map[resource.Type]string{readyType: readyOwner, machineConfigType: configOwner} {
		if err := state.Claim(typ, owner); err != nil {
			t.Fatal(err)
		}
	}
	j := &judgeCounter{problems: []string{"no interface has an address"}}
	ctrl := runCounted(t, state, &healthController{judge: j.judge, interval: func() time.Duration { return time.Hour }})
	wait.Until(t, "the controller's first run", 5*time.Second, func() bool { return ctrl.count() >= 1 })
	if _, ok := state.Get(healthType, healthID); ok || j.count() != 0 {
		t.Fatalf("judged before ready: %d", j.count())
	}
	if _, err := state.Put(readyOwner, readyType, readyID, readySpec{}); err != nil {
		t.Fatal(err)
	}
	m := &machine{resources: state}
	wait.Until(t, "a verdict", 5*time.Second, func() bool {
		got := m.Resources("health")
		return len(got) == 1 && got[0].Spec.(healthSpec).Problems[0] == "no interface has an address"
	})
	runs := ctrl.count()
	if _, err := state.Put(configOwner, machineConfigType, machineConfigID, configSpec("x", &Config{})); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the run for the new config", 5*time.Second, func() bool { return ctrl.count() > runs })
	if got := m.Resources("health"); j.count() != 1 || len(got) != 1 {
		t.Fatalf("within its interval: %d judgements, health %+v", j.count(), got)
	}
}

// The trial controller marks the slot good once the health has held for the grace period (which
// ends with time, not with a change: its period's run sees it), once; it reboots (fail) with the
// health's problems when the deadline comes first; and does nothing while no trial is open.
func TestTheTrialControllerClosesTheTrial(t *testing.T) {
	for name, tc := range map[string]struct {
		open               bool
		gate               trialGate
		health             healthSpec
		healthyFor         time.Duration // how long before the subtest starts the verdict was reached
		wantGood, wantFail int
	}{
		"held for the grace": {true, trialGate{grace: 1500 * time.Millisecond, deadline: time.Now().Add(time.Hour)},
			healthSpec{Healthy: true}, 0, 1, 0},
		"deadline first": {true, trialGate{grace: time.Hour, deadline: time.Now().Add(-time.Second)},
			healthSpec{Problems: []string{"service web: crash-looping"}}, 0, 0, 1},
		"no trial": {false, trialGate{}, healthSpec{Healthy: true}, time.Hour, 0, 0},
	} {
		t.Run(name, func(t *testing.T) {
			// from the subtest's start, not the table's: the subtests before it take seconds
			tc.health.Since = time.Now().Add(-tc.healthyFor)
			state := resource.NewState()
			if err := state.Claim(healthType, healthOwner); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			good, fail, failedWith := 0, 0, []string(nil)
			ctrl := runCounted(t, state, &trialController{
				gate: func() (trialGate, bool) { return tc.gate, tc.open },
				good: func(time.Duration) { mu.Lock(); good++; mu.Unlock() },
				fail: func(p []string) { mu.Lock(); fail++; failedWith = p; mu.Unlock() },
			})
			wait.Until(t, "the first run", 5*time.Second, func() bool { return ctrl.count() >= 1 })
			if _, err := state.Put(healthOwner, healthType, healthID, tc.health); err != nil {
				t.Fatal(err)
			}
			wait.Until(t, "the run for the verdict", 5*time.Second, func() bool { return ctrl.count() >= 2 })
			if tc.wantGood > 0 {
				mu.Lock()
				early := good
				mu.Unlock()
				if early != 0 {
					t.Fatal("marked good before the grace period ended")
				}
				// the periodic runs (every second) see the grace period end
				wait.Until(t, "marked good", 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return good > 0 })
			}
			runs := ctrl.count()
			wait.Until(t, "another run", 5*time.Second, func() bool { return ctrl.count() > runs }) // nothing more may happen
			mu.Lock()
			defer mu.Unlock()
			if good != tc.wantGood || fail != tc.wantFail || (fail == 1 && failedWith[0] != "service web: crash-looping") {
				t.Fatalf("good %d, fail %d (%v)", good, fail, failedWith)
			}
		})
	}
}

func TestTheReadyLineIsAResourceToo(t *testing.T) {
	m := withVolume(t, &machine{con: quietConsole(), version: "v1", kernel: "6.1", extensions: []Extension{{Name: "lldpd"}}},
		volumeSpec{Disk: "/dev/vda", Var: "/dev/vda6"})
	if err := m.resources.Claim(readyType, readyOwner); err != nil {
		t.Fatal(err)
	}
	m.publishReady()
	got := m.Resources(string(readyType))
	want := readySpec{Version: "v1", Kernel: "6.1", Extensions: []string{"lldpd"}, Var: "/dev/vda6", Platform: "metal"}
	if len(got) != 1 || got[0].Owner != readyOwner || !reflect.DeepEqual(got[0].Spec, want) {
		t.Fatalf("machine/ready: %+v", got)
	}
	if line := m.readyLine(); line != "machined ready: version=v1 kernel=6.1 extensions=[lldpd] var=/dev/vda6 platform=metal" {
		t.Fatalf("ready line: %q", line)
	}
}
