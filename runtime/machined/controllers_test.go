package main

import (
	"encoding/json"
	"reflect"
	"sync"
	"testing"
	"time"

	"kiln/machined/internal/network"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/testkit/wait"
)

// applyRecorder stands in for network.Network (whose Apply internal/network tests on a
// recorder and in a network namespace): it keeps every config applied, and can be held back
// to show the boot waiting for it.
type applyRecorder struct {
	mu      sync.Mutex
	applied []network.NetworkConfig
	gate    chan struct{} // when set, each Apply waits for a token
}

func (a *applyRecorder) Apply(cfg network.NetworkConfig, wait time.Duration) {
	if a.gate != nil {
		<-a.gate
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.applied = append(a.applied, cfg)
}

func (a *applyRecorder) last() (network.NetworkConfig, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.applied) == 0 {
		return network.NetworkConfig{}, 0
	}
	return a.applied[len(a.applied)-1], len(a.applied)
}

func staticConfig(addr string) network.NetworkConfig {
	no := false
	return network.NetworkConfig{Interfaces: []network.InterfaceConfig{{Name: "eth0", Addresses: []string{addr}, DHCP: &no}}}
}

// The config changes while the network is still being applied (a first config, then another,
// as an apply over the API does): the network ends on the latest, and the boot's wait returns
// only once that one is applied (the bug this replaced: the network used the config of the
// moment it started, so a kept static address was never applied).
func TestTheNetworkConvergesOnTheLatestConfig(t *testing.T) {
	rec := &applyRecorder{gate: make(chan struct{})}
	state := resource.NewState()
	if err := state.Claim(machineConfigType, configOwner); err != nil {
		t.Fatal(err)
	}
	runCounted(t, state, &networkController{net: rec, wait: time.Second})
	m := &machine{con: quietConsole(), resources: state}
	publish := func(source, address string) uint64 {
		cfg := &Config{Network: staticConfig(address)}
		if _, err := state.Put(configOwner, machineConfigType, machineConfigID, configSpec(source, cfg)); err != nil {
			t.Fatal(err)
		}
		res, _ := state.Get(machineConfigType, machineConfigID)
		return res.Version
	}
	first := publish("/dev/sr0:kiln.json", "10.0.2.50/24")
	kept := publish("/state/config.json", "10.0.2.77/24")
	if kept <= first {
		t.Fatalf("versions %d then %d", first, kept)
	}
	waited := make(chan struct{})
	go func() { m.waitNetwork(kept, 10*time.Second); close(waited) }()
	rec.gate <- struct{}{} // the first apply (whichever config it read) ends
	select {
	case <-waited:
		if cfg, _ := rec.last(); !reflect.DeepEqual(cfg, staticConfig("10.0.2.77/24")) {
			t.Fatalf("the wait ended before the kept config was applied: %+v", cfg)
		}
		return
	case <-time.After(200 * time.Millisecond):
	}
	rec.gate <- struct{}{} // the second apply: the kept config
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("the boot still waits after the kept config was applied")
	}
	if cfg, n := rec.last(); !reflect.DeepEqual(cfg, staticConfig("10.0.2.77/24")) || n != 2 {
		t.Errorf("applied %d configs, the last %+v", n, cfg)
	}
	close(rec.gate) // nothing else may be applied: the config did not change again
	publish("/state/config.json", "10.0.2.77/24")
	time.Sleep(50 * time.Millisecond) // a spurious reconcile would show within this
	if _, n := rec.last(); n != 2 {
		t.Errorf("an unchanged config was applied again (%d applies)", n)
	}
}

func TestWaitNetworkGivesUpAfterItsLimit(t *testing.T) {
	rec := &applyRecorder{gate: make(chan struct{})} // never lets an apply finish
	m := &machine{con: quietConsole(), cfg: &Config{}}
	m.startControllers(rec)
	began := time.Now()
	m.waitNetwork(m.awaitConfig(), 100*time.Millisecond)
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("waited %s", took)
	}
	if lines := m.con.log.Lines(); len(lines) == 0 || lines[len(lines)-1] != "machined: network: the config's network is not applied after 100ms; going on" {
		t.Errorf("console: %q", lines)
	}
	close(rec.gate)
}

// GET /v1/resources (kiln node get) lists the machine's resources with their versions and specs.
func TestResourcesListTheMachinesState(t *testing.T) {
	m := &machine{con: quietConsole(), cfg: &Config{Network: staticConfig("10.0.2.77/24")}, configSource: "/dev/sr0:kiln.json"}
	if got := m.Resources(""); len(got) != 0 {
		t.Fatalf("before the boot made its state: %v", got)
	}
	rec := &applyRecorder{}
	m.startControllers(rec)
	m.waitNetwork(m.awaitConfig(), 5*time.Second)
	all := m.Resources("")
	byType := map[string]int{}
	for i, r := range all {
		byType[r.Type] = i
	}
	if len(all) < 5 || all[0].Type != "config/machine" || all[1].Type != "config/source" || all[byType["network/status"]].Owner != "network" {
		t.Fatalf("resources: %+v", all)
	}
	// observed from this host's interfaces: lo at least
	wait.Until(t, "a network/link resource", observed, func() bool { return len(m.Resources("links")) > 0 })
	if net := all[byType["network/status"]]; all[0].Owner != "config" || all[1].Owner != "bootconfig" || net.Phase != "running" || all[0].Version != 1 {
		t.Errorf("metadata: %+v", all)
	}
	data, _ := json.Marshal(m.Resources("network/status"))
	if want := `[{"type":"network/status","id":"applied","version":1,"phase":"running","owner":"network","spec":{"config_version":1,"source":"/dev/sr0:kiln.json"}}]`; string(data) != want {
		t.Errorf("JSON\n%s\nwant\n%s", data, want)
	}
	if got := m.Resources("nosuch/type"); len(got) != 0 {
		t.Errorf("an unknown type: %v", got)
	}
}
