package main

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"kiln/machined/internal/bootstate"
)

func TestATrialIsHealthyWithItsConfigTheAPIAndAnAddress(t *testing.T) {
	always := func() bool { return true }
	if got := trialVerdict("", true, true, always, time.Second); len(got) != 0 {
		t.Fatalf("healthy trial judged: %v", got)
	}
	if got := trialVerdict("", false, false, always, 0); len(got) != 0 {
		t.Fatalf("no API asked for, none running: %v", got)
	}
}

func TestATrialIsNotHealthyWhenItCannotBeReached(t *testing.T) {
	never := func() bool { return false }
	got := trialVerdict("kept config: /run/kiln/state/config.json:3: unknown field \"apii\"", true, false, never, 150*time.Millisecond)
	want := []string{"its config could not be used", "the API the config asks for did not start", "no interface has an address after 150ms"}
	if len(got) != len(want) {
		t.Fatalf("verdict %q", got)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d: %q, want %q...", i, got[i], want[i])
		}
	}
}

func TestATrialWaitsForItsAddress(t *testing.T) {
	var polls atomic.Int32
	later := func() bool { return polls.Add(1) > 3 } // DHCP answers after a few polls
	began := time.Now()
	if got := trialVerdict("", false, false, later, 10*time.Second); len(got) != 0 {
		t.Fatalf("verdict %q", got)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("waited %s for an address that came after 3 polls", took)
	}
}

func TestTrialNetworkWait(t *testing.T) {
	if got := trialNetworkWait(nil); got != defaultTrialNetworkWait {
		t.Errorf("default %s", got)
	}
	if got := trialNetworkWait(map[string]string{paramTrialNetwork: "5"}); got != 5*time.Second {
		t.Errorf("5: %s", got)
	}
	if got := trialNetworkWait(map[string]string{paramTrialNetwork: "x"}); got != defaultTrialNetworkWait {
		t.Errorf("x: %s", got)
	}
}

// A rollback while an upgrade is under way is refused without touching the boot state (both
// write it); once the upgrade has failed, the rollback goes on to the slots.
func TestRollbackWaitsForNoUpgrade(t *testing.T) {
	st := bootstate.State{Default: "B", Versions: map[string]string{"A": "1", "B": "2"}}
	m := &machine{con: quietConsole(), slots: &slots{slot: "B", state: st, booted: "default", err: "BOOT not mounted in this test"}}
	m.upgrades.status = &upgradeStatus{State: upgradePulling}
	if _, err := m.rollBack(); err == nil || !strings.Contains(err.Error(), "an upgrade is pulling") {
		t.Fatalf("rollback during an upgrade: %v", err)
	}
	m.upgrades.status = &upgradeStatus{State: upgradeFailed}
	if _, err := m.rollBack(); err == nil || !strings.Contains(err.Error(), "cannot be read") {
		t.Fatalf("rollback after a failed upgrade reaches the slots: %v", err)
	}
}
