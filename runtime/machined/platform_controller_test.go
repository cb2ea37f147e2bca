package main

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"kiln/machined/internal/platform"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/testkit/wait"
)

// withPlatform gives m a platform/metadata holding p, as the platform controller would.
func withPlatform(t *testing.T, m *machine, p *platformState) *machine {
	t.Helper()
	if m.resources == nil {
		m.resources = resource.NewState()
	}
	if err := m.resources.Claim(platType, "platform"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.resources.Put("platform", platType, platformID, platformSpec{fetched: p}); err != nil {
		t.Fatal(err)
	}
	return m
}

// platformCalls stands in for the metadata service and the ready report (the e2e boots on
// every platform, with a fake metadata service and Azure's fake WireServer, run the real ones):
// it counts the fetches and the reports.
type platformCalls struct {
	impl             platform.Platform
	mu               sync.Mutex
	fetches, reports int
}

func (p *platformCalls) fetch() *platformState {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fetches++
	return &platformState{impl: p.impl}
}

func (p *platformCalls) report(*platformState) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reports++
	return "sent"
}

func (p *platformCalls) counts() (int, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fetches, p.reports
}

// The facts are fetched once, as soon as the controller runs; the ready report is sent once,
// only after machine/ready exists, and platform/metadata then says how it went.
func TestPlatformIsFetchedOnceAndReportsOnceReady(t *testing.T) {
	state := resource.NewState()
	if err := state.Claim(readyType, readyOwner); err != nil {
		t.Fatal(err)
	}
	calls := &platformCalls{impl: mustLookup(t, "azure")}
	ctrl := runCounted(t, state, &platformController{fetch: calls.fetch, report: calls.report})
	m := &machine{resources: state}
	wait.Until(t, "platform/metadata", 5*time.Second, func() bool { return m.fetchedPlatform() != nil })
	if got := m.fetchedPlatform(); got.name() != "azure" {
		t.Fatalf("fetched platform: %q", got.name())
	}
	shown := func() map[string]interface{} {
		spec, _ := json.Marshal(m.Resources("platform")[0].Spec)
		var out map[string]interface{}
		if err := json.Unmarshal(spec, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if fetches, reports := calls.counts(); fetches != 1 || reports != 0 || shown()["ready_report"] != "" {
		t.Fatalf("before ready: %d fetches, %d reports, %v", fetches, reports, shown())
	}
	if _, err := state.Put(readyOwner, readyType, readyID, readySpec{Version: "v1"}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the ready report in platform/metadata", 5*time.Second, func() bool { return shown()["ready_report"] == "sent" })
	runs := ctrl.count()
	if _, err := state.Put(readyOwner, readyType, readyID, readySpec{Version: "v2"}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the controller's run for the changed ready", 5*time.Second, func() bool { return ctrl.count() > runs })
	if fetches, reports := calls.counts(); fetches != 1 || reports != 1 || m.platformStatus()["ready_report"] != "sent" {
		t.Fatalf("after ready: %d fetches, %d reports, %v", fetches, reports, m.platformStatus())
	}
}

// The real fetch and report on metal: nothing to fetch, nothing to report, no error.
func TestMetalHasNothingToFetchOrReport(t *testing.T) {
	m := &machine{con: quietConsole(), params: map[string]string{}}
	p := m.fetchPlatform()
	if p.name() != "metal" || m.reportReady(p) != "" {
		t.Fatalf("metal: %+v", p)
	}
	spec, _ := json.Marshal(platformSpec{fetched: p})
	want := `{"error":"","hostname":"","instance_id":"","name":"metal","ready_report":"","source":"","warnings":null}`
	if string(spec) != want {
		t.Fatalf("platform/metadata on metal: %s", spec)
	}
	// an unknown platform is said and runs as metal; a failed fetch would report nothing either
	m.params[paramPlatform] = "nowhere"
	if p := m.fetchPlatform(); p.name() != "metal" || m.reportReady(&platformState{impl: mustLookup(t, "aws"), err: "x"}) != "" {
		t.Fatalf("unknown platform: %+v", p)
	}
}
