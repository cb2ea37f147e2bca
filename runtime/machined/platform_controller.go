package main

import (
	"context"
	"encoding/json"

	"kiln/machined/internal/resource"
)

// The platform controller owns platform/metadata: it fetches kiln.platform='s facts once, as
// soon as the controllers run (beside the boot's own reading of kiln.config= and the config
// drive), and once the machine is ready (machine/ready) it sends the platform its ready report.
// The config controller composes the config from the facts; everything after reads them from the
// resource (machine.fetchedPlatform).
const (
	platType   resource.Type = "platform/metadata"
	platformID               = "platform"
)

// platformSpec is platform/metadata: the fetched facts and the ready report. It shows as
// /v1/status's platform section; the facts themselves (user data may hold secrets) are not shown.
type platformSpec struct {
	fetched *platformState
	report  string // "" (none, or not yet), "sent", or why it failed
}

func (s platformSpec) MarshalJSON() ([]byte, error) { return json.Marshal(s.fetched.status(s.report)) }

// platformController fetches once and reports once, each when its moment comes.
type platformController struct {
	fetch  func() *platformState       // the metadata's fetch (machine.fetchPlatform; a fake in tests)
	report func(*platformState) string // the ready report (machine.reportReady)
	// what fetch and report gave; only this controller's goroutine touches them
	fetched *platformState
	sent    *string
}

func (c *platformController) Name() string             { return "platform" }
func (c *platformController) Inputs() []resource.Type  { return []resource.Type{readyType} }
func (c *platformController) Outputs() []resource.Type { return []resource.Type{platType} }

func (c *platformController) Reconcile(_ context.Context, r *resource.Run) error {
	if c.fetched == nil {
		c.fetched = c.fetch()
	}
	if c.sent == nil {
		if _, ready := r.Get(readyType, readyID); ready {
			report := c.report(c.fetched)
			c.sent = &report
		}
	}
	spec := platformSpec{fetched: c.fetched}
	if c.sent != nil {
		spec.report = *c.sent
	}
	return r.Put(platType, platformID, spec)
}

// fetchedPlatform is what the platform said, nil before its facts are fetched (or with no
// controllers: machined not PID 1 runs as metal).
func (m *machine) fetchedPlatform() *platformState {
	spec, _ := m.platformMetadata()
	return spec.fetched
}

// platformMetadata is platform/metadata's spec, false before there is one.
func (m *machine) platformMetadata() (platformSpec, bool) {
	if m.resources == nil {
		return platformSpec{}, false
	}
	res, ok := m.resources.Get(platType, platformID)
	if !ok {
		return platformSpec{}, false
	}
	return resource.SpecOf[platformSpec](res)
}
