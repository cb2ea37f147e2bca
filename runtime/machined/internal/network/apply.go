package network

import (
	"context"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"kiln/machined/internal/dhcp"
	"kiln/machined/internal/dhcp6"
)

// stopWait is how long Apply waits for a stopped DHCP client to hand back its lease.
const stopWait = 3 * time.Second

// loop is one running DHCP or DHCPv6 client: cancel stops it, done is closed once it has.
type loop struct {
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{}
	doneOne sync.Once
}

// staticApplied is what Apply's config set on one interface, for the next Apply to take back.
type staticApplied struct {
	prefixes []net.IPNet
	routes   []route
}

// startLoop registers a client for ifname in loops and returns it, or nil when one runs there.
func (n *Network) startLoop(loops map[string]*loop, ifname string) *loop {
	n.mu.Lock()
	defer n.mu.Unlock()
	if loops[ifname] != nil { // Apply removes the clients it stops
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &loop{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	loops[ifname] = l
	return l
}

// finish ends each run of the client (safego.Forever runs it again after a panic, and the
// run returns at once when stopped); done is closed once it is stopped and has returned.
func (l *loop) finish() {
	if l.ctx.Err() != nil {
		l.doneOne.Do(func() { close(l.done) })
	}
}

// Apply makes the interfaces what cfg says, whatever was set before it: DHCP and DHCPv6 run
// where cfg wants them and are stopped (their leases removed) where it does not, including the
// clients the boot's Configure calls started; the addresses and routes an earlier Apply set
// and cfg no longer has are removed; then cfg's own are set as Configure does. Interfaces cfg
// does not name keep nothing of DHCP when it names any (with none named, every Ethernet
// interface uses DHCP). The config's nameservers win over DHCP's for as long as it has some.
func (n *Network) Apply(cfg NetworkConfig, wait time.Duration) {
	n.applyMu.Lock()
	defer n.applyMu.Unlock()
	wanted := map[string]InterfaceConfig{}
	for _, ic := range n.interfaces(cfg) {
		wanted[ic.Name] = ic
	}
	n.stopUnwanted(n.dhcp, func(name string) bool { ic, ok := wanted[name]; return ok && ic.UsesDHCP() }, "DHCP")
	n.stopUnwanted(n.dhcp6, func(name string) bool { ic, ok := wanted[name]; return ok && ic.UsesDHCP6() }, "DHCPv6")
	n.takeBackStatic(wanted)
	if len(cfg.Nameservers) == 0 {
		n.mu.Lock()
		n.staticDNS = false // DHCP's servers count again
		n.mu.Unlock()
	}
	applied := n.configure(cfg, wait)
	n.mu.Lock()
	n.static = applied
	n.mu.Unlock()
}

// stopUnwanted stops each running client whose interface keep refuses and waits (briefly) for
// each to remove its lease.
func (n *Network) stopUnwanted(loops map[string]*loop, keep func(string) bool, what string) {
	n.mu.Lock()
	var stopping []*loop
	var names []string
	for name, l := range loops {
		if !keep(name) {
			l.cancel()
			stopping = append(stopping, l)
			names = append(names, name)
			delete(loops, name)
		}
	}
	n.mu.Unlock()
	sort.Strings(names)
	for i, l := range stopping {
		select {
		case <-l.done:
		case <-time.After(stopWait):
			n.say("network: %s: %s client still stopping after %s", names[i], what, stopWait)
		}
	}
}

// endDHCP removes what a stopped DHCP client's lease put on the interface, and its status.
func (n *Network) endDHCP(iface net.Interface) {
	endLink(n, n.links, iface.Name, func(d *dhcpLink) *dhcp.Lease { return d.lease }, func(l dhcp.Lease) {
		n.dropLease(iface, l, "given up: the config turns DHCP off here")
	})
}

// endDHCP6 removes a stopped DHCPv6 client's address and its status.
func (n *Network) endDHCP6(iface net.Interface) {
	endLink(n, n.links6, iface.Name, func(d *dhcp6Link) *dhcp6.Lease { return d.lease }, func(l dhcp6.Lease) {
		n.dropLease6(iface, l, "given up: the config turns DHCPv6 off here")
	})
}

// endLink is endDHCP and endDHCP6: drop the lease the link of name holds, if any, outside the
// lock (drop takes it), then forget the link.
func endLink[T, L any](n *Network, links map[string]*T, name string, lease func(*T) *L, drop func(L)) {
	n.mu.Lock()
	var held *L
	if d := links[name]; d != nil {
		held = lease(d)
	}
	n.mu.Unlock()
	if held != nil {
		drop(*held)
	}
	n.mu.Lock()
	delete(links, name)
	n.mu.Unlock()
}

// takeBackStatic removes the addresses and routes the last Apply set that wanted no longer has.
func (n *Network) takeBackStatic(wanted map[string]InterfaceConfig) {
	n.mu.Lock()
	before := n.static
	n.mu.Unlock()
	if len(before) == 0 {
		return
	}
	ops, err := n.openLinks()
	if err != nil {
		n.say("network: %v", err)
		return
	}
	defer ops.Close()
	for name, old := range before {
		iface, err := n.lookup(name)
		if err != nil {
			continue // gone with its addresses
		}
		ic := wanted[name]
		keepRoutes := map[string]bool{}
		if len(ic.Addresses) > 0 {
			for _, r := range planRoutes(ic.staticPrefixes(), ic.staticRoutes()) {
				keepRoutes[r.String()] = true
			}
		}
		var stale []route
		for _, r := range old.routes {
			if !keepRoutes[r.String()] {
				stale = append(stale, r)
			}
		}
		n.delRoutes(ops, *iface, stale)
		keep := map[string]bool{}
		for _, p := range ic.staticPrefixes() {
			keep[p.String()] = true
		}
		var removed []net.IPNet
		for _, p := range old.prefixes {
			if !keep[p.String()] {
				p := p
				n.delAddress(ops, *iface, &p)
				n.forget(name, p.String())
				removed = append(removed, p)
			}
		}
		if len(removed) > 0 {
			n.say("network: %s: %s removed (no longer in the config)", name, prefixesText(removed))
		}
	}
}

func prefixesText(prefixes []net.IPNet) string {
	texts := make([]string, len(prefixes))
	for i, p := range prefixes {
		texts[i] = p.String()
	}
	return strings.Join(texts, ", ")
}
