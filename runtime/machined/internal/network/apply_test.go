package network

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/dhcp"
	"kiln/machined/internal/dhcp6"
	"kiln/machined/internal/testkit"
)

// fakeClients stands in for the DHCP and DHCPv6 clients: each gets a lease at once (applied
// through the real applyLease) and holds it until stopped, then ends as the real loops do.
// The rtnetlink side is the recorder of lease_test.go; TestApplyInANetworkNamespace runs the
// same steps on real interfaces.
type fakeClients struct {
	testkit.Lines // what started and stopped
}

func applyNetwork(t *testing.T) (*Network, *recorder, *fakeClients) {
	n, rec, _ := testNetwork(t)
	n.lookup = func(name string) (*net.Interface, error) {
		index := map[string]int{"lo": 1, "eth0": 2, "eth1": 3}[name]
		if index == 0 {
			return nil, fmt.Errorf("no such interface")
		}
		return &net.Interface{Index: index, Name: name}, nil
	}
	f := &fakeClients{}
	n.runDHCP = func(ctx context.Context, iface net.Interface, first chan struct{}) {
		f.Add("dhcp %s started", iface.Name)
		lease := gcpLease(map[string]string{"eth0": "10.0.2.15", "eth1": "10.0.3.15"}[iface.Name])
		n.setState(iface.Name, dhcp.Bound)
		n.applyLease(iface, lease, false)
		close(first)
		<-ctx.Done()
		n.endDHCP(iface)
		f.Add("dhcp %s stopped", iface.Name)
	}
	n.runDHCP6 = func(ctx context.Context, iface net.Interface) {
		f.Add("dhcp6 %s started", iface.Name)
		n.applyLease6(iface, dhcp6.Lease{IP: net.ParseIP("2001:db8::15"), Valid: time.Hour, Start: t0}, false)
		<-ctx.Done()
		n.endDHCP6(iface)
		f.Add("dhcp6 %s stopped", iface.Name)
	}
	return n, rec, f
}

func static(name, addr, gateway string) NetworkConfig {
	no := false
	return NetworkConfig{Interfaces: []InterfaceConfig{{Name: name, Addresses: []string{addr}, Gateway: gateway, DHCP: &no}}}
}

func TestApplyStopsDHCPTheConfigTurnsOffAndTakesItsLease(t *testing.T) {
	n, rec, f := applyNetwork(t)
	// the boot's first step: DHCP everywhere (to reach a config URL)
	n.Configure(NetworkConfig{Interfaces: []InterfaceConfig{{Name: "eth0"}, {Name: "eth1"}}}, time.Second)
	if got := f.Take(); got != "dhcp eth0 started; dhcp6 eth0 started; dhcp eth1 started; dhcp6 eth1 started" &&
		got != "dhcp6 eth0 started; dhcp eth0 started; dhcp6 eth1 started; dhcp eth1 started" {
		// the order of the two clients of one interface is the scheduler's
		if strings.Count(got, "started") != 4 {
			t.Fatalf("clients: %s", got)
		}
	}
	rec.Take()
	// the machine config (kept on STATE): eth0 static, DHCP off; eth1 not named
	n.Apply(static("eth0", "10.0.2.77/24", "10.0.2.2"), time.Second)
	got := rec.Take()
	for _, want := range []string{"del 10.0.2.15/32", "del 10.0.3.15/32", "del 2001:db8::15/128", "add 10.0.2.77/24", "route 0.0.0.0/0 via 10.0.2.2 proto 4"} {
		if !strings.Contains(got, want) {
			t.Errorf("rtnetlink calls lack %q:\n%s", want, got)
		}
	}
	if strings.Index(got, "del 10.0.2.15/32") > strings.Index(got, "add 10.0.2.77/24") {
		t.Errorf("the static address must come after the lease is removed:\n%s", got)
	}
	if events := f.Take(); strings.Count(events, "stopped") != 4 || strings.Contains(events, "started") {
		t.Errorf("clients: %s", events)
	}
	if leases := n.Leases(); len(leases) != 0 {
		t.Errorf("leases of stopped clients still reported: %v", leases)
	}
	if addrs := n.Addresses(); !reflect.DeepEqual(addrs["eth0"], []string{"10.0.2.77/24"}) || len(addrs["eth1"]) != 0 {
		t.Errorf("addresses %v", addrs)
	}

	// applying the same config again changes nothing
	n.Apply(static("eth0", "10.0.2.77/24", "10.0.2.2"), time.Second)
	if got := rec.Take(); strings.Contains(got, "del") || strings.Contains(got, "unroute") {
		t.Errorf("an unchanged config removed something: %s", got)
	}
	if events := f.Take(); events != "" {
		t.Errorf("an unchanged config touched the clients: %s", events)
	}

	// back to DHCP on eth0 (dhcp6 off): the static address and route go, DHCP starts again
	no := false
	n.Apply(NetworkConfig{Interfaces: []InterfaceConfig{{Name: "eth0", DHCP6: &no}}}, time.Second)
	got = rec.Take()
	if !strings.Contains(got, "del 10.0.2.77/24") || !strings.Contains(got, "unroute 0.0.0.0/0 via 10.0.2.2") ||
		!strings.Contains(got, "add 10.0.2.15/32") {
		t.Errorf("back to DHCP: %s", got)
	}
	if events := f.Take(); events != "dhcp eth0 started" {
		t.Errorf("clients: %s", events)
	}
	if addrs := n.Addresses(); !reflect.DeepEqual(addrs["eth0"], []string{"10.0.2.15/32"}) {
		t.Errorf("addresses %v", addrs)
	}
}

func TestApplyConfigNameserversWinOnlyWhileTheConfigHasThem(t *testing.T) {
	n, _, _ := applyNetwork(t)
	cfg := static("eth0", "10.0.2.77/24", "10.0.2.2")
	cfg.Nameservers = []string{"192.0.2.53"}
	n.Apply(cfg, time.Second)
	n.Apply(NetworkConfig{Interfaces: []InterfaceConfig{{Name: "eth1"}}}, time.Second) // DHCP's DNS: 169.254.169.254
	// without config nameservers, DHCP's count again
	wantResolvConf(t, n, "nameserver 169.254.169.254\n")
}
