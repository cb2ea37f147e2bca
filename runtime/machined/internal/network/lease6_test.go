package network

import (
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/dhcp6"
)

func lease6(ip string) dhcp6.Lease {
	return dhcp6.Lease{IP: net.ParseIP(ip), Valid: 2 * time.Minute, Preferred: 2 * time.Minute, T1: time.Minute, T2: 105 * time.Second,
		ServerID: []byte{0, 3, 0, 1, 1, 2, 3, 4, 5, 6}, DNS: []net.IP{net.ParseIP("2001:db8::53")},
		NTP: []net.IP{net.ParseIP("2001:db8::123")}, Start: t0}
}

// A DHCPv6 lease goes on as a /128, is replaced when it moves and removed when lost; it
// shows in Leases as "eth0/dhcp6", gives NTP servers after DHCPv4's, and DNS servers only
// when DHCPv4 gave none.
func TestDHCP6LeaseAppliedMovedAndLost(t *testing.T) {
	n, rec, said := testNetwork(t)
	n.applyLease6(eth0, lease6("2001:db8::100"), false)
	if got := rec.Take(); got != "add 2001:db8::100/128" {
		t.Fatalf("calls: %s", got)
	}
	wantResolvConf(t, n, "nameserver 2001:db8::53\n")
	n.applyLease6(eth0, lease6("2001:db8::100"), true)
	moved := lease6("2001:db8::200")
	n.applyLease6(eth0, moved, true)
	if got := rec.Take(); got != "add 2001:db8::100/128; add 2001:db8::200/128; del 2001:db8::100/128" {
		t.Fatalf("calls: %s", got)
	}
	li := n.Leases()["eth0/dhcp6"]
	if li.Address != "2001:db8::200/128" || li.Renewals != 2 || li.LeaseSeconds != 120 || li.ExpiresInSeconds != 20 ||
		li.Server != "00030001010203040506" || !reflect.DeepEqual(li.DNS, []string{"2001:db8::53"}) {
		t.Errorf("%+v", li)
	}
	if got := n.Addresses()["eth0"]; !reflect.DeepEqual(got, []string{"2001:db8::200/128"}) {
		t.Errorf("addresses %v", got)
	}
	v4 := gcpLease("10.128.0.5")
	n.applyLease(eth0, v4, false)
	rec.Take()
	if got := n.NTPServers(); !reflect.DeepEqual(got, []string{"169.254.169.254", "2001:db8::123"}) {
		t.Errorf("NTP %v", got)
	}
	n.applyLease6(eth0, moved, true) // DHCPv4's DNS servers stay
	wantResolvConf(t, n, "nameserver 169.254.169.254\n")
	n.dropLease6(eth0, moved, "expired")
	if got := rec.Take(); got != "add 2001:db8::200/128; del 2001:db8::200/128" {
		t.Fatalf("calls: %s", got)
	}
	if li := n.Leases()["eth0/dhcp6"]; li.Address != "" || li.Renewals != 0 {
		t.Errorf("%+v", li)
	}
	if got := n.Addresses()["eth0"]; !reflect.DeepEqual(got, []string{"10.128.0.5/32"}) {
		t.Errorf("addresses %v", got)
	}
	if !strings.Contains(strings.Join(*said, "\n"), "eth0: 2001:db8::100/128 via DHCPv6") {
		t.Errorf("console: %q", *said)
	}
}
