package network

import (
	"net"
	"strings"
	"testing"

	"kiln/machined/internal/dhcp"
)

func cidr(s string) net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return net.IPNet{IP: ip.To4(), Mask: n.Mask}
}

func via(dst, gw string) route {
	n := cidr(dst)
	n.IP = n.IP.Mask(n.Mask)
	r := route{dst: n, proto: rtprotDHCP}
	if gw != "" {
		r.gw = net.ParseIP(gw).To4()
	}
	return r
}

func TestPlanRoutes(t *testing.T) {
	for _, c := range []struct {
		name     string
		prefixes []string
		routes   []route
		want     string
	}{
		{"gateway in the subnet", []string{"10.0.0.5/24"}, []route{via("0.0.0.0/0", "10.0.0.1")}, "0.0.0.0/0 via 10.0.0.1"},
		{"GCP: the host route comes in the lease, listed after", []string{"10.128.0.5/32"},
			[]route{via("0.0.0.0/0", "10.128.0.1"), via("10.128.0.1/32", "")}, "10.128.0.1/32 on-link, 0.0.0.0/0 via 10.128.0.1"},
		{"gateway in no subnet: a host route first", []string{"10.128.0.5/32"},
			[]route{via("0.0.0.0/0", "10.128.0.1"), via("192.0.2.0/24", "10.128.0.1")},
			"10.128.0.1/32 on-link, 0.0.0.0/0 via 10.128.0.1, 192.0.2.0/24 via 10.128.0.1"},
		{"gateway inside an on-link route", []string{"10.128.0.5/32"},
			[]route{via("0.0.0.0/0", "10.1.2.3"), via("10.1.0.0/16", "")}, "10.1.0.0/16 on-link, 0.0.0.0/0 via 10.1.2.3"},
		{"on-link default route", nil, []route{via("0.0.0.0/0", "")}, "0.0.0.0/0 on-link"},
		{"nothing", []string{"10.0.0.5/24"}, nil, "none"},
	} {
		var prefixes []net.IPNet
		for _, p := range c.prefixes {
			prefixes = append(prefixes, cidr(p))
		}
		if got := routesText(planRoutes(prefixes, c.routes)); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

func TestLeaseRoutes(t *testing.T) {
	l := dhcp.Lease{Router: net.IPv4(10, 0, 0, 1)}
	if got := routesText(leaseRoutes(l)); got != "0.0.0.0/0 via 10.0.0.1" {
		t.Fatal(got)
	}
	l.Router = nil
	l.Routes = []dhcp.Route{{Dst: cidr("10.0.0.1/32")}, {Dst: cidr("0.0.0.0/0"), Gateway: net.IPv4(10, 0, 0, 1)}}
	rs := leaseRoutes(l)
	if got := routesText(rs); got != "10.0.0.1/32 on-link, 0.0.0.0/0 via 10.0.0.1" || rs[0].proto != rtprotDHCP {
		t.Fatal(got)
	}
	if rs[0].scope() != 253 || rs[1].scope() != 0 {
		t.Fatalf("scopes %d %d: want link (253) and universe (0)", rs[0].scope(), rs[1].scope())
	}
	if leaseRoutes(dhcp.Lease{}) != nil {
		t.Fatal("no router, no routes")
	}
}

func TestValidateRoutesAndMTU(t *testing.T) {
	ok := NetworkConfig{Interfaces: []InterfaceConfig{{Name: "eth0", Addresses: []string{"10.128.0.5/32"}, Gateway: "10.128.0.1",
		MTU: 1460, Routes: []RouteConfig{{To: "0.0.0.0/0", Via: "10.128.0.1"}, {To: "10.128.0.1/32"}, {To: "192.0.2.0/24"}}}}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ic   InterfaceConfig
		want string
	}{
		{InterfaceConfig{Name: "eth0", MTU: 575}, "mtu 575"},
		{InterfaceConfig{Name: "eth0", MTU: 65536}, "mtu 65536"},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "10.0.0.0"}}}, "routes[0]: to \"10.0.0.0\""},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "10.0.0.1/8"}}}, "want the network address, 10.0.0.0/8"},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "::ffff:10.0.0.0/104"}}}, "IPv4-mapped"},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "ff02::/16"}}}, "multicast"},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "2001:db8::1/32"}}}, "want the network address, 2001:db8::/32"},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "::/0", Via: "10.0.0.1"}}}, "want an IPv6 address"},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "::/0", Via: "ff02::2"}}}, "want an IPv6 address"},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "::/0", Via: "::"}}}, "want an IPv6 address"},
		{InterfaceConfig{Name: "eth0", Addresses: []string{"::ffff:192.0.2.1/128"}}, "IPv4-mapped"},
		{InterfaceConfig{Name: "eth0", Addresses: []string{"ff02::1/64"}}, "multicast"},
		{InterfaceConfig{Name: "eth0", Addresses: []string{"224.0.0.1/4"}}, "multicast"},
		{InterfaceConfig{Name: "eth0", Addresses: []string{"::/64"}}, "unspecified"},
		{InterfaceConfig{Name: "eth0", Addresses: []string{"2001:db8::10"}}, "no prefix length"},
		{InterfaceConfig{Name: "eth0", Addresses: []string{"2001:db8::10/64"}, Gateway: "fe80::1"}, "not an IPv4 address"},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "0.0.0.0/0", Via: "gateway"}}}, "via \"gateway\""},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "0.0.0.0/0", Via: "0.0.0.0"}}}, "via \"0.0.0.0\""},
		{InterfaceConfig{Name: "eth0", Routes: []RouteConfig{{To: "0.0.0.0/0", Via: "fe80::1"}}}, "want an IPv4 address"},
	} {
		cfg := NetworkConfig{Interfaces: []InterfaceConfig{c.ic}}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.ic, err, c.want)
		}
	}
}

func TestValidateIPv6(t *testing.T) {
	ok := NetworkConfig{Interfaces: []InterfaceConfig{{Name: "eth0", Addresses: []string{"192.0.2.10/24", "2001:db8::10/64"},
		Gateway: "192.0.2.1", Routes: []RouteConfig{{To: "::/0", Via: "fe80::1"}, {To: "2001:db8:1::/48", Via: "2001:db8::1"}, {To: "2001:db8:2::/48"}}}},
		Nameservers: []string{"2001:4860:4860::8888", "8.8.8.8"}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	ic := ok.Interfaces[0]
	if got := routesText(planRoutes(ic.staticPrefixes(), ic.staticRoutes())); got !=
		"2001:db8:2::/48 on-link, 0.0.0.0/0 via 192.0.2.1, ::/0 via fe80::1, 2001:db8:1::/48 via 2001:db8::1" {
		t.Fatal(got)
	}
	// a global gateway outside the prefixes gets its host route; a link-local one needs none
	ic = InterfaceConfig{Name: "eth0", Addresses: []string{"2001:db8::10/128"}, Routes: []RouteConfig{{To: "::/0", Via: "2001:db8::1"}}}
	if got := routesText(planRoutes(ic.staticPrefixes(), ic.staticRoutes())); got != "2001:db8::1/128 on-link, ::/0 via 2001:db8::1" {
		t.Fatal(got)
	}
	if p := ic.staticPrefixes(); len(p) != 1 || len(p[0].IP) != 16 || p[0].String() != "2001:db8::10/128" {
		t.Fatal(p)
	}
	yes, no := true, false
	for _, c := range []struct {
		ic   InterfaceConfig
		want bool
	}{{InterfaceConfig{}, true}, {InterfaceConfig{Addresses: []string{"2001:db8::10/64"}}, false},
		{InterfaceConfig{DHCP6: &yes, Addresses: []string{"192.0.2.1/24"}}, true}, {InterfaceConfig{DHCP6: &no}, false}} {
		if c.ic.UsesDHCP6() != c.want {
			t.Errorf("%+v: UsesDHCP6 %v", c.ic, !c.want)
		}
	}
}

func TestStaticRoutes(t *testing.T) {
	ic := InterfaceConfig{Name: "eth0", Addresses: []string{"10.128.0.5/32"}, Gateway: "10.128.0.1",
		Routes: []RouteConfig{{To: "192.0.2.0/24"}, {To: "bad"}}}
	rs := ic.staticRoutes()
	if got := routesText(rs); got != "0.0.0.0/0 via 10.128.0.1, 192.0.2.0/24 on-link" || rs[0].proto != rtprotStatic {
		t.Fatal(got)
	}
	if got := routesText(planRoutes(ic.staticPrefixes(), rs)); got != "192.0.2.0/24 on-link, 10.128.0.1/32 on-link, 0.0.0.0/0 via 10.128.0.1" {
		t.Fatal(got)
	}
}
