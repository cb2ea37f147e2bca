package main

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/machined/internal/resource"
	"kiln/machined/internal/testkit/wait"
)

// The upgrade controller runs each accepted request once, by its number, whatever else wakes it;
// the request shows what it installs, never the URL it came with (credentials, presigned query).
// (The run itself is a recorder here: it pulls, mounts and installs, which the e2e upgrades do.)
func TestEachAcceptedUpgradeRunsOnce(t *testing.T) {
	state := resource.NewState()
	if err := state.Claim(upgradeAskType, upgradeAskOwner); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ran []string
	ctrl := runCounted(t, state, &upgradeController{run: func(req upgradeRequest, slot string) {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, req.URL+" "+slot)
	}})
	ranCount := func() int { mu.Lock(); defer mu.Unlock(); return len(ran) }
	secret := "https://user:pw@10.0.0.1/installer.tar?X-Amz-Signature=abc"
	ask := func(n int, slot string) {
		req := upgradeRequest{URL: secret}
		if _, err := state.Put(upgradeAskOwner, upgradeAskType, upgradeAskID, upgradeAsk{Number: n, Image: req.describe(), Slot: slot, req: req}); err != nil {
			t.Fatal(err)
		}
	}
	ask(1, "B")
	wait.Until(t, "the first upgrade run", 5*time.Second, func() bool { return ranCount() == 1 })
	runs := ctrl.count()
	ask(1, "A") // the same request number again: not a new upgrade
	wait.Until(t, "the run for the change", 5*time.Second, func() bool { return ctrl.count() > runs })
	if n := ranCount(); n != 1 {
		t.Fatalf("the same request ran %d times", n)
	}
	ask(2, "A")
	wait.Until(t, "the second upgrade run", 5*time.Second, func() bool { return ranCount() == 2 })
	mu.Lock()
	if ran[0] != secret+" B" || ran[1] != secret+" A" {
		t.Errorf("ran %q", ran)
	}
	mu.Unlock()
	shown, _ := json.Marshal((&machine{resources: state}).Resources("upgrade-request"))
	if strings.Contains(string(shown), "pw") || strings.Contains(string(shown), "Signature") || !strings.Contains(string(shown), `"number":2`) {
		t.Errorf("upgrade/request shows %s", shown)
	}
}
