package network

import (
	"fmt"
	"net"
)

// NetworkConfig is the machine config's network section; with no interfaces listed every
// Ethernet interface uses DHCP.
type NetworkConfig struct {
	Interfaces  []InterfaceConfig `json:"interfaces,omitempty"`
	Nameservers []string          `json:"nameservers,omitempty"`
}

// InterfaceConfig configures one interface; with no addresses it uses DHCP. MTU and routes
// apply with or without DHCP: they win over a lease's MTU and are added after its routes.
type InterfaceConfig struct {
	Name      string        `json:"name"`
	DHCP      *bool         `json:"dhcp,omitempty"`
	Addresses []string      `json:"addresses,omitempty"` // CIDR: 192.168.1.10/24
	Gateway   string        `json:"gateway,omitempty"`
	MTU       int           `json:"mtu,omitempty"`
	Routes    []RouteConfig `json:"routes,omitempty"`
}

// RouteConfig is a static route; a gateway outside the interface's prefixes is made
// reachable with an on-link host route, as clouds with /32 addresses need.
type RouteConfig struct {
	To  string `json:"to"`            // CIDR: 10.0.0.0/8, or 0.0.0.0/0 for a default route
	Via string `json:"via,omitempty"` // gateway; empty: the destination is on the link
}

const (
	minMTU = 576 // the smallest IPv4 datagram every host must take (RFC 791)
	maxMTU = 65535
)

// parse checks the route and gives it to the kernel's form.
func (r RouteConfig) parse(proto byte) (route, error) {
	ip, dst, err := net.ParseCIDR(r.To)
	if err != nil || ip.To4() == nil {
		return route{}, fmt.Errorf("to %q: want an IPv4 CIDR such as 10.0.0.0/8", r.To)
	}
	if !ip.Equal(dst.IP) {
		return route{}, fmt.Errorf("to %q: want the network address, %s", r.To, dst)
	}
	rt := route{dst: net.IPNet{IP: dst.IP.To4(), Mask: dst.Mask}, proto: proto}
	if r.Via != "" {
		gw := net.ParseIP(r.Via).To4()
		if gw == nil || gw.IsUnspecified() {
			return route{}, fmt.Errorf("via %q: want an IPv4 address", r.Via)
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
		if ip, ipnet, err := net.ParseCIDR(a); err == nil && ip.To4() != nil {
			out = append(out, net.IPNet{IP: ip.To4(), Mask: ipnet.Mask})
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
			if ip, _, err := net.ParseCIDR(a); err != nil || ip.To4() == nil {
				return fmt.Errorf("network.interfaces[%d] (%s): address %q: want IPv4 CIDR such as 192.168.1.10/24", i, iface.Name, a)
			}
		}
		if g := iface.Gateway; g != "" && (net.ParseIP(g) == nil || net.ParseIP(g).To4() == nil) {
			return fmt.Errorf("network.interfaces[%d] (%s): gateway %q is not an IPv4 address", i, iface.Name, g)
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
