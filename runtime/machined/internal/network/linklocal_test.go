package network

import (
	"net"
	"strings"
	"testing"

	"kiln/machined/internal/dhcp"
)

func TestCoversLinkLocal(t *testing.T) {
	for dst, want := range map[string]bool{
		"169.254.169.254/32": true, "169.254.0.0/16": true, "169.0.0.0/8": true, "128.0.0.0/1": true,
		"169.254.169.0/24": true, "0.0.0.0/0": false, "10.0.0.0/8": false, "168.63.129.16/32": false,
		"169.255.0.0/16": false, "fe80::/64": false, "::/0": false,
	} {
		r := route{dst: cidr(dst)}
		if got := coversLinkLocal(r); got != want {
			t.Errorf("%s: %v, want %v", dst, got, want)
		}
	}
}

// azureLease is what Azure's DHCP gives: a default route, and host routes to the WireServer and
// to the metadata service, all via the subnet's gateway.
func azureLease(ip string) dhcp.Lease {
	l := gcpLease(ip)
	l.Mask = net.CIDRMask(24, 32)
	gw := net.IPv4(10, 0, 1, 1).To4()
	l.Routes = []dhcp.Route{{Dst: cidr("0.0.0.0/0"), Gateway: gw}, {Dst: cidr("168.63.129.16/32"), Gateway: gw},
		{Dst: cidr("169.254.169.254/32"), Gateway: gw}}
	return l
}

var eth1 = net.Interface{Index: 3, Name: "eth1"}

func TestLinkLocalRoutesOnlyOnTheMetadataInterface(t *testing.T) {
	n, rec, said := testNetwork(t)
	n.SetMetadataInterface(func() string { return "eth0" })
	n.setState("eth1", dhcp.Bound)
	n.applyLease(eth1, azureLease("10.0.1.5"), false)
	if got := rec.Take(); strings.Contains(got, "169.254") || !strings.Contains(got, "route 168.63.129.16/32 via 10.0.1.1") {
		t.Fatalf("eth1 took %s", got)
	}
	if text := strings.Join(*said, "\n"); !strings.Contains(text, "eth1: DHCP routes 169.254.169.254/32 via 10.0.1.1 ignored") {
		t.Fatalf("console: %s", text)
	}
	info := n.Leases()["eth1"]
	if len(info.IgnoredRoutes) != 1 || info.IgnoredRoutes[0].To != "169.254.169.254/32" || len(info.Routes) != 2 {
		t.Fatalf("status: %+v", info)
	}
	*said = nil
	n.applyLease(eth1, azureLease("10.0.1.5"), true)
	if len(*said) != 0 {
		t.Fatalf("a renewal says it again: %q", *said)
	}

	n.setState("eth0", dhcp.Bound)
	n.applyLease(eth0, azureLease("10.0.0.5"), false)
	if got := rec.Take(); !strings.Contains(got, "route 169.254.169.254/32 via 10.0.1.1") {
		t.Fatalf("the metadata interface did not take its route: %s", got)
	}
	if info := n.Leases()["eth0"]; len(info.IgnoredRoutes) != 0 || len(info.Routes) != 3 {
		t.Fatalf("eth0 status: %+v", info)
	}
}

func TestLinkLocalRoutesIgnoredEverywhereWithoutAMetadataInterface(t *testing.T) {
	for _, which := range []func() string{nil, func() string { return "" }} {
		n, rec, _ := testNetwork(t)
		if which != nil {
			n.SetMetadataInterface(which)
		}
		n.setState("eth0", dhcp.Bound)
		l := azureLease("10.0.0.5")
		l.Routes = append(l.Routes, dhcp.Route{Dst: cidr("128.0.0.0/1"), Gateway: net.IPv4(10, 0, 1, 1).To4()})
		n.applyLease(eth0, l, false)
		if got := rec.Take(); strings.Contains(got, "169.254") || strings.Contains(got, "128.0.0.0/1") || !strings.Contains(got, "0.0.0.0/0") {
			t.Fatalf("took %s", got)
		}
	}
}
