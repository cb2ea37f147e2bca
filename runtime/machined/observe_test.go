package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/machined/internal/bootstate"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit/wait"
)

// fakeLinks stands in for the kernel's interfaces (readKernelLinks reads the real ones, which
// TestKernelLinksAreRead checks on this host); the test changes them under the observer.
type fakeLinks struct {
	mu        sync.Mutex
	links     []linkSpec
	addresses []addressSpec
	err       error
}

func (f *fakeLinks) read() ([]linkSpec, []addressSpec, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]linkSpec(nil), f.links...), append([]addressSpec(nil), f.addresses...), f.err
}

func (f *fakeLinks) set(links []linkSpec, addresses []addressSpec, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.links, f.addresses, f.err = links, addresses, err
}

func runObservers(t *testing.T, controllers ...resource.Controller) *resource.State {
	state := resource.NewState()
	rt := resource.NewRuntime(state, t.Logf)
	for _, c := range controllers {
		if err := rt.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rt.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return state
}

// observed is how long an observer may take to see a change: a few periods.
const observed = 4*observeEvery + 2*time.Second

var (
	eth0       = linkSpec{Name: "eth0", MAC: "52:54:00:12:34:56", MTU: 1500, Up: true}
	dhcpAddr   = addressSpec{Interface: "eth0", Address: "10.0.2.15/24", Family: "inet", Scope: "global"}
	linkLocal  = addressSpec{Interface: "eth0", Address: "fe80::5054:ff:fe12:3456/64", Family: "inet6", Scope: "link"}
	staticAddr = addressSpec{Interface: "eth0", Address: "10.0.2.77/24", Family: "inet", Scope: "global"}
)

// The links observer follows the kernel: an address that appears becomes a resource, one that
// goes is destroyed, a link that goes down says so, and a failed read keeps what was seen.
func TestLinksObserverFollowsTheKernel(t *testing.T) {
	kernel := &fakeLinks{links: []linkSpec{eth0}, addresses: []addressSpec{dhcpAddr, linkLocal}}
	state := runObservers(t, &linksObserver{read: kernel.read})
	wait.Until(t, "eth0's two addresses observed", observed, func() bool { return len(state.List(addressType)) == 2 })
	if got := observedAddresses(state); !reflect.DeepEqual(got, map[string][]string{"eth0": {"10.0.2.15/24", "fe80::5054:ff:fe12:3456/64"}}) {
		t.Fatalf("observed addresses: %v", got)
	}
	res, ok := state.Get(addressType, "eth0/10.0.2.15/24")
	if spec, _ := resource.SpecOf[addressSpec](res); !ok || spec != dhcpAddr {
		t.Fatalf("address resource: %+v", res)
	}

	down := eth0
	down.Up = false
	kernel.set([]linkSpec{down}, []addressSpec{staticAddr}, nil)
	wait.Until(t, "the DHCP address destroyed and the static one observed", observed, func() bool {
		_, gone := state.Get(addressType, "eth0/10.0.2.15/24")
		_, there := state.Get(addressType, "eth0/10.0.2.77/24")
		return !gone && there
	})
	wait.Until(t, "eth0 seen down", observed, func() bool {
		res, _ := state.Get(linkType, "eth0")
		spec, _ := resource.SpecOf[linkSpec](res)
		return !spec.Up
	})

	kernel.set(nil, nil, errors.New("netlink: no buffer space"))
	time.Sleep(2 * observeEvery)
	if _, ok := state.Get(addressType, "eth0/10.0.2.77/24"); !ok {
		t.Fatal("a failed read removed what was seen")
	}
}

// The services observer mirrors the supervisor, and health reads services from it.
func TestServicesObserverMirrorsTheSupervisor(t *testing.T) {
	var mu sync.Mutex
	services := []supervisor.ServiceStatus{{Name: "web", State: supervisor.StateRunning, Type: "simple"}}
	read := func() []supervisor.ServiceStatus {
		mu.Lock()
		defer mu.Unlock()
		return append([]supervisor.ServiceStatus(nil), services...)
	}
	state := runObservers(t, &servicesObserver{read: read})
	wait.Until(t, "web observed running", observed, func() bool { return len(observedServices(state)) == 1 })
	mu.Lock()
	services = []supervisor.ServiceStatus{{Name: "web", State: "backoff", Type: "simple", Restarts: 3}}
	mu.Unlock()
	wait.Until(t, "web observed in backoff", observed, func() bool {
		got := observedServices(state)
		return len(got) == 1 && got[0].State == "backoff" && got[0].Restarts == 3
	})
	problems := healthProblems(healthInputs{addresses: map[string][]string{"eth0": {"10.0.2.15/24"}}, services: observedServices(state)})
	if !reflect.DeepEqual(problems, []string{"service web is backoff"}) {
		t.Fatalf("health problems: %v", problems)
	}
}

// Only link-local addresses observed: the health says no interface has an address.
func TestHealthJudgesTheObservedAddresses(t *testing.T) {
	kernel := &fakeLinks{links: []linkSpec{eth0}, addresses: []addressSpec{linkLocal, {Interface: "lo", Address: "127.0.0.1/8", Family: "inet", Scope: "host"}}}
	state := runObservers(t, &linksObserver{read: kernel.read})
	wait.Until(t, "addresses observed", observed, func() bool { return len(state.List(addressType)) == 2 })
	if _, ok := observedAddresses(state)["lo"]; ok {
		t.Fatal("loopback's address counted")
	}
	if problems := addressProblems(staticConfig("10.0.2.77/24"), observedAddresses(state)); !reflect.DeepEqual(problems, []string{"no interface has an address", "eth0 lacks its address 10.0.2.77/24"}) {
		t.Fatalf("problems: %v", problems)
	}
}

func TestAddressesAreClassified(t *testing.T) {
	for cidr, want := range map[string][2]string{
		"10.0.2.15/24": {"inet", "global"}, "127.0.0.1/8": {"inet", "host"}, "::1/128": {"inet6", "host"},
		"fe80::1/64": {"inet6", "link"}, "2001:db8::5/64": {"inet6", "global"}, "169.254.3.4/16": {"inet", "link"},
	} {
		ip, ipnet, err := net.ParseCIDR(cidr)
		if err != nil {
			t.Fatal(err)
		}
		ipnet.IP = ip
		got := addressOf("x", ipnet)
		if got.Address != cidr || got.Family != want[0] || got.Scope != want[1] {
			t.Errorf("%s: %+v, want %v", cidr, got, want)
		}
	}
}

// This host's own interfaces read as the machine reads its own: lo at least, with 127.0.0.1.
func TestKernelLinksAreRead(t *testing.T) {
	links, addresses, err := readKernelLinks()
	if err != nil {
		t.Fatal(err)
	}
	var lo bool
	for _, l := range links {
		lo = lo || (l.Loopback && l.Name != "")
	}
	var host bool
	for _, a := range addresses {
		host = host || (a.Address == "127.0.0.1/8" && a.Scope == "host")
	}
	if !lo || !host {
		t.Fatalf("links %+v, addresses %+v", links, addresses)
	}
}

// kiln node get takes the short names: addresses, links, services, config, health, ready.
func TestResourceTypesByAlias(t *testing.T) {
	m := &machine{con: quietConsole(), cfg: &Config{}, configSource: "test"}
	m.startControllers(&applyRecorder{})
	m.awaitConfig()
	wait.Until(t, "links observed", observed, func() bool { return len(m.Resources("network/link")) > 0 })
	if got, want := len(m.Resources("links")), len(m.Resources("network/link")); got != want {
		t.Errorf("links: %d, network/link: %d", got, want)
	}
	if got := m.Resources("config"); len(got) != 1 || got[0].Type != "config/machine" {
		t.Errorf("config: %+v", got)
	}
	w, err := m.WatchResources("addresses", "")
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := m.WatchResources("nosuch", ""); err == nil {
		t.Error("a watch of an unknown type was accepted")
	}
}

// The boot state is a resource once the machine is ready (kiln node get bootstate), and follows
// the slots; the clock's status is one from the start (time sync off here).
func TestBootStateAndTimeAreObserved(t *testing.T) {
	s := &slots{slot: "B", booted: "trial", state: bootstate.State{Default: "A", Next: "B", Tries: 2, Versions: map[string]string{"A": "0.1.0"}}}
	m := &machine{con: quietConsole(), cfg: &Config{}, isReady: make(chan struct{}), slots: s}
	m.startControllers(&applyRecorder{})
	wait.Until(t, "time/status", observed, func() bool { return len(m.Resources("time")) == 1 })
	if spec, _ := json.Marshal(m.Resources("time")[0].Spec); !strings.Contains(string(spec), "time sync is off") {
		t.Errorf("time/status: %s", spec)
	}
	if got := m.Resources("bootstate"); len(got) != 0 {
		t.Fatalf("a boot state before ready: %+v", got)
	}
	close(m.isReady)
	bootedAs := func() string {
		got := m.Resources("bootstate")
		if len(got) != 1 {
			return ""
		}
		spec, _ := got[0].Spec.(map[string]interface{})
		return fmt.Sprint(spec["booted_as"])
	}
	wait.Until(t, "boot/state on trial", observed, func() bool { return bootedAs() == "trial" })
	s.mu.Lock()
	s.booted, s.state.Default, s.state.Next = "default", "B", ""
	s.mu.Unlock()
	wait.Until(t, "boot/state made default", observed, func() bool { return bootedAs() == "default" })
}

// The platform's metadata is a resource from the start (the platform controller's; metal here,
// as no kiln.platform= says otherwise); the upgrade's status once there is an upgrade.
func TestPlatformAndUpgradeAreResources(t *testing.T) {
	m := &machine{con: quietConsole(), cfg: &Config{}, isReady: make(chan struct{})}
	m.startControllers(&applyRecorder{})
	wait.Until(t, "platform/metadata", observed, func() bool { return len(m.Resources("platform")) == 1 })
	if got := m.Resources("platform")[0]; got.Owner != "platform" || m.platformStatus()["name"] != "metal" {
		t.Errorf("platform/metadata: %+v", got)
	}
	if got := m.Resources("upgrade"); len(got) != 0 {
		t.Fatalf("an upgrade status with no upgrade: %+v", got)
	}
	m.upgrades.mu.Lock()
	m.upgrades.begin(&upgradeStatus{State: upgradeFailed, Version: "0.2.0"})
	m.upgrades.mu.Unlock()
	// the upgrader puts its status itself: it is there at once, with no observer's period to wait
	if got, ok := m.Resources("upgrade")[0].Spec.(*upgradeStatus); !ok || got.State != upgradeFailed || got.Version != "0.2.0" {
		t.Errorf("upgrade/status: %+v", m.Resources("upgrade")[0].Spec)
	}
}
