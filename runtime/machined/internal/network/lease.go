package network

import (
	"fmt"
	"net"
	"sort"
	"syscall"
	"time"

	"kiln/machined/internal/dhcp"
)

// dhcpLink is one interface's DHCP state. It remembers what applying the lease put on the
// interface, so a renewal that moves the address or routes replaces them and an expiry
// removes them; it outlives a restarted dhcpLoop for the same reason.
type dhcpLink struct {
	cfg      InterfaceConfig // its MTU and routes win over and outlive the lease's
	state    dhcp.State
	lease    *dhcp.Lease
	renewals int // since the lease was acquired
	addr     *net.IPNet
	routes   []route
	ignored  []route // the lease's routes covering 169.254.0.0/16 that were not taken (linklocal.go)
}

// LeaseInfo is one interface's DHCP lease as status shows it.
type LeaseInfo struct {
	State            string        `json:"state"` // init, requesting, bound, renewing, rebinding
	Address          string        `json:"address,omitempty"`
	Router           string        `json:"router,omitempty"`
	Routes           []RouteConfig `json:"routes,omitempty"`         // option 121 or 249
	IgnoredRoutes    []RouteConfig `json:"ignored_routes,omitempty"` // of those, covering 169.254.0.0/16 off the metadata interface
	MTU              int           `json:"mtu,omitempty"`
	DNS              []string      `json:"dns,omitempty"`
	NTP              []string      `json:"ntp,omitempty"`
	Hostname         string        `json:"hostname,omitempty"`
	Domain           string        `json:"domain,omitempty"`
	Server           string        `json:"server,omitempty"`
	LeaseSeconds     int           `json:"lease_seconds,omitempty"`
	ExpiresInSeconds int           `json:"expires_in_seconds,omitempty"`
	Renewals         int           `json:"renewals"`
}

// Leases returns interface -> DHCP lease, for every interface that runs DHCP, and
// "interface/dhcp6" -> DHCPv6 lease (address, DNS, NTP, server DUID, valid lifetime) for
// every interface that runs DHCPv6.
func (n *Network) Leases() map[string]LeaseInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]LeaseInfo{}
	for name, link := range n.links {
		out[name] = link.info(n.now())
	}
	for name, link := range n.links6 {
		out[leaseKey6(name)] = link.info(n.now())
	}
	return out
}

func (d *dhcpLink) info(now time.Time) LeaseInfo {
	li := LeaseInfo{State: d.state.String(), Renewals: d.renewals}
	l := d.lease
	if l == nil {
		return li
	}
	li.Address = l.IPNet().String()
	if l.Router != nil {
		li.Router = l.Router.String()
	}
	if len(l.Routes) > 0 {
		for _, r := range leaseRoutes(*l) {
			if isIgnored(r, d.ignored) {
				li.IgnoredRoutes = append(li.IgnoredRoutes, r.config())
				continue
			}
			li.Routes = append(li.Routes, r.config())
		}
	}
	li.MTU, li.Hostname, li.Domain = l.MTU, l.Hostname, l.Domain
	li.DNS, li.NTP = ipStrings(l.DNS), ipStrings(l.NTP)
	if l.ServerID != nil {
		li.Server = l.ServerID.String()
	}
	li.LeaseSeconds = int(l.Lease / time.Second)
	if left := l.Expiry().Sub(now); left > 0 {
		li.ExpiresInSeconds = int(left / time.Second)
	}
	return li
}

// NTPServers are the NTP servers of all DHCP leases (option 42), then those of the DHCPv6
// leases (options 56 and 31): interfaces in name order, each server once.
func (n *Network) NTPServers() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var all []string
	for _, name := range sortedNames(n.links) {
		if l := n.links[name].lease; l != nil {
			all = append(all, ipStrings(l.NTP)...)
		}
	}
	for _, name := range sortedNames(n.links6) {
		if l := n.links6[name].lease; l != nil {
			all = append(all, ipStrings(l.NTP)...)
		}
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range all {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// sortedNames are links' interface names in order, so that what is built from them is stable.
func sortedNames[T any](links map[string]*T) []string {
	names := make([]string, 0, len(links))
	for name := range links {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

func ipStrings(ips []net.IP) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

// link returns the interface's DHCP state, creating it.
func (n *Network) link(name string) *dhcpLink { return linkOf(n, n.links, name) }

// linkOf returns the entry of links for the interface name, creating it: link and link6.
func linkOf[T any](n *Network, links map[string]*T, name string) *T {
	n.mu.Lock()
	defer n.mu.Unlock()
	d := links[name]
	if d == nil {
		d = new(T)
		links[name] = d
	}
	return d
}

// setConfig keeps the config of a DHCP interface for applyLease.
func (n *Network) setConfig(ic InterfaceConfig) {
	d := n.link(ic.Name)
	n.mu.Lock()
	defer n.mu.Unlock()
	d.cfg = ic
}

func (n *Network) setState(name string, s dhcp.State) {
	d := n.link(name)
	n.mu.Lock()
	defer n.mu.Unlock()
	d.state = s
}

// applyLease puts a new or renewed lease on the interface: MTU, address, routes (replacing
// what the previous lease put there), then the config's own routes again.
func (n *Network) applyLease(ifc net.Interface, l dhcp.Lease, renewed bool) {
	ops, ok := n.linksFor(ifc.Name)
	if !ok {
		return
	}
	defer ops.Close()
	d := n.link(ifc.Name)
	n.mu.Lock()
	cfg, oldAddr, oldRoutes := d.cfg, d.addr, d.routes
	n.mu.Unlock()
	if l.MTU > 0 && cfg.MTU == 0 {
		if err := ops.setMTU(ifc.Index, l.MTU); err != nil {
			n.say("network: %s: MTU %d: %v", ifc.Name, l.MTU, err)
		}
	}
	addr := l.IPNet()
	if err := ops.addAddress(ifc.Index, addr); err != nil {
		n.say("network: %s: DHCP address %s: %v", ifc.Name, addr, err)
		return
	}
	prefixes := append(cfg.staticPrefixes(), *addr)
	wanted, ignored := n.splitLinkLocal(ifc.Name, leaseRoutes(l))
	routes := n.addRoutes(ops, ifc, prefixes, wanted)
	n.removeStale(ops, ifc, oldAddr, oldRoutes, addr, routes)
	n.addRoutes(ops, ifc, append(prefixes, onLinkPrefixes(routes)...), cfg.staticRoutes())
	changed := oldAddr == nil || oldAddr.String() != addr.String() || !sameRoutes(oldRoutes, routes)
	n.mu.Lock()
	ignoredBefore := d.ignored
	d.lease, d.addr, d.routes, d.ignored = &l, addr, routes, ignored
	if renewed {
		d.renewals++
	} else {
		d.renewals = 0
	}
	n.mu.Unlock()
	if oldAddr != nil && oldAddr.String() != addr.String() {
		n.forget(ifc.Name, oldAddr.String())
	}
	n.record(ifc.Name, addr.String())
	if changed {
		mtu := ""
		if l.MTU > 0 {
			mtu = fmt.Sprintf(", mtu %d", l.MTU)
		}
		n.say("network: %s: %s via DHCP (routes %s%s, lease %s)", ifc.Name, addr, routesText(routes), mtu, l.Lease)
	}
	if len(ignored) > 0 && routesText(ignored) != routesText(ignoredBefore) {
		n.say("network: %s: DHCP routes %s ignored: routes into 169.254.0.0/16 (the metadata service's block) "+
			"are taken only on the interface that serves the metadata", ifc.Name, ignoredText(ignored))
	}
	n.setDNS(ipStrings(l.DNS), false)
}

// removeStale removes what the previous lease added and the new one does not have. A
// route to a destination the new lease also routes was replaced already, so it stays.
func (n *Network) removeStale(ops linkOps, ifc net.Interface, oldAddr *net.IPNet, oldRoutes []route, addr *net.IPNet, routes []route) {
	var stale []route
	for _, r := range oldRoutes {
		if !sameDestination(r, routes) {
			stale = append(stale, r)
		}
	}
	n.delRoutes(ops, ifc, stale)
	if oldAddr != nil && oldAddr.String() != addr.String() {
		n.delAddress(ops, ifc, oldAddr)
	}
}

// dropLease removes what a lost lease put on the interface; the client starts over.
func (n *Network) dropLease(ifc net.Interface, l dhcp.Lease, reason string) {
	d := n.link(ifc.Name)
	n.mu.Lock()
	addr, routes := d.addr, d.routes
	d.lease, d.addr, d.routes, d.ignored, d.renewals = nil, nil, nil, nil, 0
	n.mu.Unlock()
	n.say("network: %s: DHCP lease %s %s; removing it", ifc.Name, l.IPNet(), reason)
	ops, ok := n.linksFor(ifc.Name)
	if !ok {
		return
	}
	defer ops.Close()
	n.delRoutes(ops, ifc, routes)
	if addr != nil {
		n.delAddress(ops, ifc, addr)
		n.forget(ifc.Name, addr.String())
	}
}

// linksFor opens rtnetlink for work on the interface ifname, saying why not when it cannot.
func (n *Network) linksFor(ifname string) (linkOps, bool) {
	ops, err := n.openLinks()
	if err != nil {
		n.say("network: %s: %v", ifname, err)
		return nil, false
	}
	return ops, true
}

func (n *Network) delAddress(ops linkOps, ifc net.Interface, addr *net.IPNet) {
	if err := ops.delAddress(ifc.Index, addr); err != nil && err != syscall.EADDRNOTAVAIL {
		n.say("network: %s: removing address %s: %v", ifc.Name, addr, err)
	}
}

func sameRoutes(a, b []route) bool {
	return routesText(a) == routesText(b)
}

func routesText(routes []route) string {
	s := ""
	for i, r := range routes {
		if i > 0 {
			s += ", "
		}
		s += r.String()
	}
	if s == "" {
		return "none"
	}
	return s
}
