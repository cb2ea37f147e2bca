package network

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kiln/machined/internal/dhcp"
	"kiln/machined/internal/testkit"
)

// recorder stands in for rtnetlink: it logs each request (from any goroutine: the DHCP
// clients apply their leases on their own).
type recorder struct {
	testkit.Lines
}

func (r *recorder) log(format string, args ...interface{}) error {
	r.Add(format, args...)
	return nil
}

func (r *recorder) addAddress(i int, a *net.IPNet) error { return r.log("add %s", a) }
func (r *recorder) delAddress(i int, a *net.IPNet) error { return r.log("del %s", a) }
func (r *recorder) addRoute(i int, rt route) error       { return r.log("route %s proto %d", rt, rt.proto) }
func (r *recorder) delRoute(i int, rt route) error {
	r.log("unroute %s", rt)
	return syscall.ESRCH // already gone: must not be reported
}
func (r *recorder) setMTU(i int, mtu int) error { return r.log("mtu %d", mtu) }
func (r *recorder) linkUp(i int) error          { return nil }
func (r *recorder) Close()                      {}

var t0 = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func testNetwork(t *testing.T) (*Network, *recorder, *[]string) {
	var said []string
	var saidMu sync.Mutex
	n := New(func(f string, a ...interface{}) {
		saidMu.Lock()
		defer saidMu.Unlock()
		said = append(said, fmt.Sprintf(f, a...))
	})
	rec := &recorder{}
	n.openLinks = func() (linkOps, error) { return rec, nil }
	n.resolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	n.now = func() time.Time { return t0.Add(100 * time.Second) }
	return n, rec, &said
}

func gcpLease(ip string) dhcp.Lease {
	return dhcp.Lease{IP: net.ParseIP(ip).To4(), Mask: net.CIDRMask(32, 32), MTU: 1460, ServerID: net.IPv4(169, 254, 169, 254),
		Routes: []dhcp.Route{{Dst: cidr("10.128.0.1/32")}, {Dst: cidr("0.0.0.0/0"), Gateway: net.IPv4(10, 128, 0, 1).To4()}},
		DNS:    []net.IP{net.IPv4(169, 254, 169, 254)}, NTP: []net.IP{net.IPv4(169, 254, 169, 254)},
		Start: t0, Lease: time.Hour, Renew: 30 * time.Minute, Rebind: 52 * time.Minute}
}

// wantResolvConf fails the test unless n's resolv.conf reads want.
func wantResolvConf(t *testing.T, n *Network, want string) {
	t.Helper()
	if data, _ := os.ReadFile(n.resolvConf); string(data) != want {
		t.Errorf("resolv.conf %q, want %q", data, want)
	}
}

var eth0 = net.Interface{Index: 2, Name: "eth0"}

func TestApplyLeaseRenewAndLose(t *testing.T) {
	n, rec, said := testNetwork(t)
	n.setState("eth0", dhcp.Bound)
	n.applyLease(eth0, gcpLease("10.128.0.5"), false)
	if got := rec.Take(); got != "mtu 1460; add 10.128.0.5/32; route 10.128.0.1/32 on-link proto 16; route 0.0.0.0/0 via 10.128.0.1 proto 16" {
		t.Fatalf("first lease: %s", got)
	}
	wantResolvConf(t, n, "nameserver 169.254.169.254\n")
	n.applyLease(eth0, gcpLease("10.128.0.5"), true)
	if got := rec.Take(); strings.Contains(got, "del") || strings.Contains(got, "unroute") {
		t.Fatalf("an unchanged renewal removes nothing: %s", got)
	}
	moved := gcpLease("10.128.0.9")
	moved.Routes = []dhcp.Route{{Dst: cidr("0.0.0.0/0"), Gateway: net.IPv4(10, 128, 0, 1).To4()}}
	n.applyLease(eth0, moved, true)
	want := "mtu 1460; add 10.128.0.9/32; route 10.128.0.1/32 on-link proto 16; route 0.0.0.0/0 via 10.128.0.1 proto 16; del 10.128.0.5/32"
	if got := rec.Take(); got != want {
		t.Fatalf("moved lease:\n%s\nwant\n%s", got, want)
	}
	if got := n.Addresses()["eth0"]; !reflect.DeepEqual(got, []string{"10.128.0.9/32"}) {
		t.Errorf("addresses %v", got)
	}
	info := n.Leases()["eth0"]
	wantInfo := LeaseInfo{State: "bound", Address: "10.128.0.9/32", Routes: []RouteConfig{{To: "0.0.0.0/0", Via: "10.128.0.1"}},
		MTU: 1460, DNS: []string{"169.254.169.254"}, NTP: []string{"169.254.169.254"}, Server: "169.254.169.254",
		LeaseSeconds: 3600, ExpiresInSeconds: 3500, Renewals: 2}
	if !reflect.DeepEqual(info, wantInfo) {
		t.Errorf("lease info\n%+v\nwant\n%+v", info, wantInfo)
	}
	n.dropLease(eth0, moved, "expired")
	if got := rec.Take(); got != "unroute 0.0.0.0/0 via 10.128.0.1; unroute 10.128.0.1/32 on-link; del 10.128.0.9/32" {
		t.Fatalf("lost lease: %s", got)
	}
	if len(n.Addresses()["eth0"]) != 0 || n.Leases()["eth0"].Address != "" || n.NTPServers() != nil {
		t.Errorf("after losing the lease: %v %+v %v", n.Addresses(), n.Leases(), n.NTPServers())
	}
	for _, s := range *said {
		if strings.Contains(s, "removing route") {
			t.Errorf("a route already gone is not an error: %s", s)
		}
	}
}

func TestApplyLeaseReplacesRoutesByDestination(t *testing.T) {
	n, rec, _ := testNetwork(t)
	l := dhcp.Lease{IP: net.IPv4(10, 0, 0, 5).To4(), Mask: net.CIDRMask(24, 32), Router: net.IPv4(10, 0, 0, 1).To4(), Start: t0, Lease: time.Hour}
	n.applyLease(eth0, l, false)
	if got := rec.Take(); got != "add 10.0.0.5/24; route 0.0.0.0/0 via 10.0.0.1 proto 16" {
		t.Fatal(got)
	}
	l.Router = net.IPv4(10, 0, 0, 254).To4()
	n.applyLease(eth0, l, true)
	if got := rec.Take(); got != "add 10.0.0.5/24; route 0.0.0.0/0 via 10.0.0.254 proto 16" {
		t.Fatalf("the new default route replaces the old; deleting the old by destination would take the new: %s", got)
	}
}

func TestApplyLeaseWithConfig(t *testing.T) {
	n, rec, _ := testNetwork(t)
	n.setConfig(InterfaceConfig{Name: "eth0", MTU: 9000, Routes: []RouteConfig{{To: "192.0.2.0/24", Via: "10.128.0.1"}}})
	n.applyLease(eth0, gcpLease("10.128.0.5"), false)
	want := "add 10.128.0.5/32; route 10.128.0.1/32 on-link proto 16; route 0.0.0.0/0 via 10.128.0.1 proto 16; route 192.0.2.0/24 via 10.128.0.1 proto 4"
	if got := rec.Take(); got != want {
		t.Fatalf("the config's MTU wins and its routes follow the lease's:\n%s\nwant\n%s", got, want)
	}
}

func TestApplyStatic(t *testing.T) {
	n, rec, _ := testNetwork(t)
	n.applyStatic(rec, eth0, InterfaceConfig{Name: "eth0", Addresses: []string{"10.128.0.5/32"}, Gateway: "10.128.0.1", MTU: 1460,
		Routes: []RouteConfig{{To: "192.0.2.0/24", Via: "10.128.0.1"}, {To: "198.51.100.0/24"}}})
	want := "mtu 1460; add 10.128.0.5/32; route 198.51.100.0/24 on-link proto 4; route 10.128.0.1/32 on-link proto 4; " +
		"route 0.0.0.0/0 via 10.128.0.1 proto 4; route 192.0.2.0/24 via 10.128.0.1 proto 4"
	if got := rec.Take(); got != want {
		t.Fatalf("\n%s\nwant\n%s", got, want)
	}
	n.applyStatic(rec, eth0, InterfaceConfig{Name: "eth0", MTU: 1500, Routes: []RouteConfig{{To: "192.0.2.0/24", Via: "10.0.0.1"}}})
	if got := rec.Take(); got != "mtu 1500" {
		t.Fatalf("DHCP alone: the routes wait for the lease: %s", got)
	}
}

func TestLeaseInfoStates(t *testing.T) {
	n, _, _ := testNetwork(t)
	n.setState("eth1", dhcp.Init)
	n.setState("eth0", dhcp.Rebinding)
	n.applyLease(eth0, dhcp.Lease{IP: net.IPv4(10, 0, 0, 5).To4(), Mask: net.CIDRMask(24, 32), Router: net.IPv4(10, 0, 0, 1).To4(),
		Hostname: "vm", Domain: "example.internal", Start: t0, Lease: time.Minute}, true)
	got := n.Leases()
	if got["eth1"].State != "init" || got["eth1"].Address != "" || got["eth0"].State != "rebinding" || got["eth0"].Router != "10.0.0.1" ||
		got["eth0"].Routes != nil || got["eth0"].ExpiresInSeconds != 0 || got["eth0"].Hostname != "vm" || got["eth0"].Renewals != 1 {
		t.Fatalf("%+v", got)
	}
}

func TestNTPServers(t *testing.T) {
	n, _, _ := testNetwork(t)
	a, b := gcpLease("10.0.0.5"), gcpLease("10.1.0.5")
	a.NTP = []net.IP{net.IPv4(10, 0, 0, 2), net.IPv4(10, 0, 0, 1)}
	b.NTP = []net.IP{net.IPv4(10, 0, 0, 1), net.IPv4(10, 1, 0, 1)}
	n.applyLease(net.Interface{Index: 3, Name: "eth1"}, b, false)
	n.applyLease(eth0, a, false)
	n.setState("eth2", dhcp.Init)
	if got := n.NTPServers(); !reflect.DeepEqual(got, []string{"10.0.0.2", "10.0.0.1", "10.1.0.1"}) {
		t.Fatalf("%v: want eth0's, then eth1's new ones", got)
	}
}
