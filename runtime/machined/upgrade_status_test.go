package main

import (
	"testing"
	"time"

	"kiln/machined/internal/resource"
)

// upgrade/status follows every change of the upgrade's state at once, and the pulled bytes
// alone at most once per progressEvery: a pull counts each read, and every put wakes the
// resource's watchers.
func TestUpgradeStatusFollowsEachStepAndThrottlesProgress(t *testing.T) {
	m := &machine{con: quietConsole(), resources: resource.NewState()}
	if err := m.resources.Claim(upgradeType, upgradeOwner); err != nil {
		t.Fatal(err)
	}
	m.publishUpgrades()
	version := func() uint64 { res, _ := m.resources.Get(upgradeType, upgradeID); return res.Version }
	shown := func() upgradeStatus {
		res, _ := m.resources.Get(upgradeType, upgradeID)
		s, _ := resource.SpecOf[*upgradeStatus](res)
		return *s
	}
	m.upgrades.mu.Lock()
	m.upgrades.begin(&upgradeStatus{State: upgradePulling, Slot: "B"})
	m.upgrades.mu.Unlock()
	if version() != 1 || shown().State != upgradePulling {
		t.Fatalf("the first status: version %d, %+v", version(), shown())
	}
	for i := 0; i < 1000; i++ { // a fast pull's reads, well within progressEvery
		m.upgrades.update(func(s *upgradeStatus) { s.PulledBytes += 32 << 10 })
	}
	if version() > 2 {
		t.Fatalf("the pulled bytes alone were put %d times in a moment", version()-1)
	}
	m.upgrades.update(func(s *upgradeStatus) { s.State = upgradeInstalling })
	if got := shown(); got.State != upgradeInstalling || got.PulledBytes != 1000*32<<10 {
		t.Fatalf("a step is put at once, with the bytes pulled so far: %+v", got)
	}
	m.upgrades.mu.Lock()
	m.upgrades.published = time.Now().Add(-progressEvery) // as if a second had passed
	m.upgrades.mu.Unlock()
	before := version()
	m.upgrades.update(func(s *upgradeStatus) { s.PulledBytes++ })
	if version() != before+1 || shown().PulledBytes != 1000*32<<10+1 {
		t.Fatalf("progress after progressEvery: version %d then %d, %+v", before, version(), shown())
	}
}
