package main

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/machined/internal/bootstate"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/testkit/wait"
)

// The API's rollback is a request the rollback controller runs once, by its number, and answers
// in rollback/status: the slot, or why not. The controller's run is a stub here (the slots'
// rollback mounts BOOT; the e2e upgrade test rolls back under real GRUB).
func TestARollbackIsAskedOfTheControllerAndAnsweredByItsNumber(t *testing.T) {
	state := resource.NewState()
	if err := state.Claim(rollbackAskType, rollbackAskOwner); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	answers := []error{nil, errors.New("slot A holds no system to roll back to")}
	calls := 0
	run := func() (string, error) {
		mu.Lock()
		defer mu.Unlock()
		err := answers[calls]
		calls++
		if err != nil {
			return "", err
		}
		return "A", nil
	}
	ctrl := runCounted(t, state, &rollbackController{run: run})
	m := &machine{con: quietConsole(), resources: state}
	if slot, err := m.Rollback(); slot != "A" || err != nil {
		t.Fatalf("first rollback: %q %v", slot, err)
	}
	if slot, err := m.Rollback(); slot != "" || err == nil || !strings.Contains(err.Error(), "no system to roll back to") {
		t.Fatalf("second rollback: %q %v", slot, err)
	}
	runs := ctrl.count()
	// an older number (a request put again) changes the resource, and runs nothing
	if _, err := state.Put(rollbackAskOwner, rollbackAskType, rollbackAskID, rollbackAsk{Number: 1}); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the run for the older request", 5*time.Second, func() bool { return ctrl.count() > runs })
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Fatalf("an older request ran again: %d runs", calls)
	}
	if got := m.Resources("rollback"); len(got) != 1 || got[0].Spec != (rollbackStatus{Number: 2, Error: "slot A holds no system to roll back to"}) {
		t.Fatalf("rollback/status: %+v", got)
	}
}

// Wired as the boot wires it, a rollback asked while an upgrade is under way is refused, and
// one asked of a machine whose boot state cannot be read says so.
func TestARollbackThroughTheMachinesControllers(t *testing.T) {
	st := bootstate.State{Default: "B", Versions: map[string]string{"A": "1", "B": "2"}}
	m := &machine{con: quietConsole(), cfg: &Config{}, params: map[string]string{}, isReady: make(chan struct{}),
		slots: &slots{slot: "B", state: st, booted: "default", err: "BOOT not mounted in this test"}}
	m.startControllers(&applyRecorder{})
	m.upgrades.mu.Lock()
	m.upgrades.status = &upgradeStatus{State: upgradePulling}
	m.upgrades.mu.Unlock()
	if _, err := m.Rollback(); err == nil || !strings.Contains(err.Error(), "an upgrade is pulling") {
		t.Fatalf("rollback during an upgrade: %v", err)
	}
	m.upgrades.mu.Lock()
	m.upgrades.status = &upgradeStatus{State: upgradeFailed}
	m.upgrades.mu.Unlock()
	if _, err := m.Rollback(); err == nil || !strings.Contains(err.Error(), "cannot be read") {
		t.Fatalf("rollback after a failed upgrade reaches the slots: %v", err)
	}
	if bare := (&machine{}); bare.resources == nil {
		if _, err := bare.Rollback(); err == nil {
			t.Fatal("a machine without controllers rolled back")
		}
	}
}
