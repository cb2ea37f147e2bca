package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"kiln/machined/internal/resource"
)

// A rollback the API is asked for (POST /v1/rollback) is a rollback/request, which the rollback
// controller runs once, by its number: it puts the other slot on trial in the boot state, under
// the upgrader's lock (machine.rollBack), and says how that went as rollback/status. The API
// answers from that status, and reboots once the slot is on trial.
const (
	rollbackAskType  resource.Type = "rollback/request"
	rollbackAskID                  = "request"
	rollbackAskOwner               = "api"

	rollbackType resource.Type = "rollback/status"
	rollbackID                 = "rollback"

	// rollbackWait bounds the API's wait for the controller's answer (a write to BOOT)
	rollbackWait = 30 * time.Second
)

// rollbackAsk is rollback/request: the how-manieth rollback asked since boot.
type rollbackAsk struct {
	Number int `json:"number"`
}

// rollbackStatus is rollback/status: the last rollback run, the slot now on trial or why not.
type rollbackStatus struct {
	Number int    `json:"number"`
	Slot   string `json:"slot,omitempty"`
	Error  string `json:"error,omitempty"`
}

// rollbackController runs each rollback/request once.
type rollbackController struct {
	run  func() (string, error) // machine.rollBack
	last *rollbackStatus        // the last one it ran; only this controller's goroutine touches it
}

func (c *rollbackController) Name() string             { return "rollback" }
func (c *rollbackController) Inputs() []resource.Type  { return []resource.Type{rollbackAskType} }
func (c *rollbackController) Outputs() []resource.Type { return []resource.Type{rollbackType} }

func (c *rollbackController) Reconcile(_ context.Context, r *resource.Run) error {
	ask, ok := specAt[rollbackAsk](r, rollbackAskType, rollbackAskID)
	if ok && (c.last == nil || ask.Number > c.last.Number) {
		c.last = &rollbackStatus{Number: ask.Number} // before it runs: a panic in it is not retried
		slot, err := c.run()
		c.last.Slot = slot
		if err != nil {
			c.last.Slot, c.last.Error = "", err.Error()
		}
	}
	if c.last == nil {
		return nil
	}
	return r.Put(rollbackType, rollbackID, *c.last)
}

// rollbackAsks numbers the rollbacks asked since boot; one is asked at a time.
type rollbackAsks struct {
	mu     sync.Mutex
	number int
}

// Rollback asks the rollback controller to put the other slot on trial and returns the slot, or
// why not; the API then reboots.
func (m *machine) Rollback() (string, error) {
	if m.resources == nil {
		return "", errors.New("this machine runs no controllers to roll back")
	}
	m.rollbacks.mu.Lock() // one at a time: each waits for its own answer
	defer m.rollbacks.mu.Unlock()
	m.rollbacks.number++
	number := m.rollbacks.number
	if _, err := m.resources.Put(rollbackAskOwner, rollbackAskType, rollbackAskID, rollbackAsk{Number: number}); err != nil {
		return "", err
	}
	answered := func(res resource.Resource) bool {
		s, ok := resource.SpecOf[rollbackStatus](res)
		return ok && s.Number == number
	}
	res, ok := m.awaitFor(rollbackType, rollbackID, rollbackWait, answered)
	if !ok {
		return "", fmt.Errorf("no answer within %s", rollbackWait)
	}
	s, _ := resource.SpecOf[rollbackStatus](res)
	if s.Error != "" {
		return "", errors.New(s.Error)
	}
	return s.Slot, nil
}
