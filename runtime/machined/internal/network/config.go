package network

import (
	"fmt"
	"net"
	"strings"
)

// NetworkConfig is the machine config's network section; with no interfaces listed every
// Ethernet interface uses DHCP.
type NetworkConfig struct {
	Interfaces  []InterfaceConfig `json:"interfaces,omitempty"`
	Nameservers []string          `json:"nameservers,omitempty"`
}

// InterfaceConfig configures one interface; with no addresses it uses DHCP. MTU and routes
// apply with or without DHCP: they win over a lease's MTU and are added after its routes.
//
// Addresses and routes may be IPv4 or IPv6. Gateway is the IPv4 default route only; the
// IPv6 default route is a route like any other, routes: [{to: "::/0", via: "fe80::1"}], and
// its gateway may be link-local (fe80::/10), since the route is bound to the interface.
//
// DHCP6 runs a DHCPv6 client (RFC 8415, addresses only) on the interface; unset, it runs
// wherever DHCP does. It never delays the boot: its address, DNS and NTP servers are applied
// whenever a server answers, and without a server it keeps asking quietly. The kernel's
// router advertisement handling (SLAAC, the on-link prefix and the default route) is
// separate and stays on.
type InterfaceConfig struct {
	Name      string        `json:"name"`
	DHCP      *bool         `json:"dhcp,omitempty"`
	DHCP6     *bool         `json:"dhcp6,omitempty"`
	Addresses []string      `json:"addresses,omitempty"` // CIDR: 192.168.1.10/24, 2001:db8::10/64
	Gateway   string        `json:"gateway,omitempty"`   // IPv4
	MTU       int           `json:"mtu,omitempty"`
	Routes    []RouteConfig `json:"routes,omitempty"`
}

// RouteConfig is a static route; a gateway outside the interface's prefixes is made
// reachable with an on-link host route, as clouds with /32 addresses need (an IPv6
// link-local gateway is always reachable).
type RouteConfig struct {
	To  string `json:"to"`            // CIDR: 10.0.0.0/8, 2001:db8::/32, 0.0.0.0/0 or ::/0 for a default route
	Via string `json:"via,omitempty"` // gateway of the same family; empty: the destination is on the link
}

// parseIP reads an address, 4 bytes for IPv4 and 16 for IPv6. It refuses IPv4-mapped IPv6
// addresses (::ffff:192.0.2.1: say which family is meant) and multicast addresses.
func parseIP(s string) (ip net.IP, v6 bool, err error) {
	ip = net.ParseIP(s)
	v6 = strings.Contains(s, ":")
	switch {
	case ip == nil:
		return nil, false, fmt.Errorf("not an IP address")
	case v6 && ip.To4() != nil:
		return nil, false, fmt.Errorf("an IPv4-mapped IPv6 address: write the IPv4 address")
	case ip.IsMulticast():
		return nil, false, fmt.Errorf("a multicast address")
	case v6:
		return ip.To16(), true, nil
	}
	return ip.To4(), false, nil
}

// parseCIDR reads an address or network with its prefix, as parseIP checks it; ip is the
// address as written, ipnet the network.
func parseCIDR(s string) (ip net.IP, ipnet *net.IPNet, v6 bool, err error) {
	slash := strings.IndexByte(s, '/')
	if slash < 0 {
		return nil, nil, false, fmt.Errorf("no prefix length")
	}
	if ip, v6, err = parseIP(s[:slash]); err != nil {
		return nil, nil, false, err
	}
	_, ipnet, err = net.ParseCIDR(s)
	if err != nil {
		return nil, nil, false, fmt.Errorf("not a CIDR")
	}
	if !v6 {
		ipnet.IP = ipnet.IP.To4()
	}
	return ip, ipnet, v6, nil
}

const (
	minMTU = 576 // the smallest IPv4 datagram every host must take (RFC 791)
	maxMTU = 65535
)

// parse checks the route and gives it to the kernel's form.
func (r RouteConfig) parse(proto byte) (route, error) {
	ip, dst, v6, err := parseCIDR(r.To)
	if err != nil {
		return route{}, fmt.Errorf("to %q: want a CIDR such as 10.0.0.0/8 or 2001:db8::/32 (%v)", r.To, err)
	}
	if !ip.Equal(dst.IP) {
		return route{}, fmt.Errorf("to %q: want the network address, %s", r.To, dst)
	}
	rt := route{dst: *dst, proto: proto}
	if r.Via != "" {
		family := "IPv4"
		if v6 {
			family = "IPv6"
		}
		gw, gw6, err := parseIP(r.Via)
		if err != nil || gw6 != v6 || gw.IsUnspecified() {
			return route{}, fmt.Errorf("via %q: want an %s address", r.Via, family)
		}
		rt.gw = gw
	}
	return rt, nil
}

// staticRoutes are the configured routes, the gateway's default route first; invalid ones
// (Validate reports them) are left out.
func (i InterfaceConfig) staticRoutes() []route {
	var out []route
	if gw := net.ParseIP(i.Gateway).To4(); gw != nil {
		out = append(out, defaultRoute(gw, rtprotStatic))
	}
	for _, rc := range i.Routes {
		if r, err := rc.parse(rtprotStatic); err == nil {
			out = append(out, r)
		}
	}
	return out
}

// staticPrefixes are the configured addresses with their prefixes.
func (i InterfaceConfig) staticPrefixes() []net.IPNet {
	var out []net.IPNet
	for _, a := range i.Addresses {
		if ip, ipnet, _, err := parseCIDR(a); err == nil {
			out = append(out, net.IPNet{IP: ip, Mask: ipnet.Mask})
		}
	}
	return out
}

// UsesDHCP says whether the interface uses DHCP: it does unless addresses are given and
// dhcp is not forced on.
func (i InterfaceConfig) UsesDHCP() bool {
	if i.DHCP != nil {
		return *i.DHCP
	}
	return len(i.Addresses) == 0
}

// UsesDHCP6 says whether the interface runs DHCPv6: as dhcp6 says, else wherever DHCP runs.
func (i InterfaceConfig) UsesDHCP6() bool {
	if i.DHCP6 != nil {
		return *i.DHCP6
	}
	return i.UsesDHCP()
}

// Validate checks the network section of a machine config.
func (n *NetworkConfig) Validate() error {
	names := map[string]bool{}
	for i, iface := range n.Interfaces {
		if iface.Name == "" {
			return fmt.Errorf("network.interfaces[%d]: name is required", i)
		}
		if names[iface.Name] {
			return fmt.Errorf("network.interfaces: %q is listed twice", iface.Name)
		}
		names[iface.Name] = true
		for _, a := range iface.Addresses {
			if ip, _, _, err := parseCIDR(a); err != nil || ip.IsUnspecified() {
				why := "the unspecified address"
				if err != nil {
					why = err.Error()
				}
				return fmt.Errorf("network.interfaces[%d] (%s): address %q: want a CIDR such as 192.168.1.10/24 or 2001:db8::10/64 (%s)", i, iface.Name, a, why)
			}
		}
		if _, v6, err := parseIP(iface.Gateway); iface.Gateway != "" && (err != nil || v6) {
			return fmt.Errorf("network.interfaces[%d] (%s): gateway %q is not an IPv4 address (an IPv6 default route is routes: [{to: \"::/0\", via: ...}])", i, iface.Name, iface.Gateway)
		}
		if iface.Gateway != "" && len(iface.Addresses) == 0 {
			return fmt.Errorf("network.interfaces[%d] (%s): a gateway needs a static address", i, iface.Name)
		}
		if m := iface.MTU; m != 0 && (m < minMTU || m > maxMTU) {
			return fmt.Errorf("network.interfaces[%d] (%s): mtu %d: want %d to %d", i, iface.Name, m, minMTU, maxMTU)
		}
		for j, rc := range iface.Routes {
			if _, err := rc.parse(rtprotStatic); err != nil {
				return fmt.Errorf("network.interfaces[%d] (%s): routes[%d]: %v", i, iface.Name, j, err)
			}
		}
	}
	for _, ns := range n.Nameservers {
		if net.ParseIP(ns) == nil {
			return fmt.Errorf("network.nameservers: %q is not an IP address", ns)
		}
	}
	return nil
}
