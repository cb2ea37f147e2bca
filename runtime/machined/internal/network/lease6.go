package network

import (
	"context"
	"net"
	"time"

	"kiln/machined/internal/dhcp6"
	"kiln/machined/internal/safego"
)

// dhcp6Link is one interface's DHCPv6 state: the lease and the /128 it put on the interface.
type dhcp6Link struct {
	state    dhcp6.State
	lease    *dhcp6.Lease
	renewals int
	addr     *net.IPNet
}

// leaseKey is the Leases key of an interface's DHCPv6 lease.
func leaseKey6(ifname string) string { return ifname + "/dhcp6" }

func (d *dhcp6Link) info(now time.Time) LeaseInfo {
	li := LeaseInfo{State: d.state.String(), Renewals: d.renewals}
	l := d.lease
	if l == nil {
		return li
	}
	li.Address = l.IPNet().String()
	li.DNS, li.NTP = ipStrings(l.DNS), ipStrings(l.NTP)
	li.Server = l.Server()
	li.LeaseSeconds = int(l.Valid / time.Second)
	if left := l.Expiry().Sub(now); left > 0 {
		li.ExpiresInSeconds = int(left / time.Second)
	}
	return li
}

// link6 returns the interface's DHCPv6 state, creating it.
func (n *Network) link6(name string) *dhcp6Link { return linkOf(n, n.links6, name) }

// startDHCP6 starts the interface's DHCPv6 client unless one runs, and runs it again should
// it panic, until Apply stops it. Nothing waits for it: DHCPv6 never holds up the boot.
func (n *Network) startDHCP6(iface net.Interface) {
	l := n.startLoop(n.dhcp6, iface.Name)
	if l == nil {
		return
	}
	safego.Forever("dhcp6 "+iface.Name, func() {
		defer l.finish()
		if l.ctx.Err() == nil {
			n.runDHCP6(l.ctx, iface)
		}
	})
}

// dhcp6Loop runs the interface's DHCPv6 client until ctx ends; then its address is removed.
func (n *Network) dhcp6Loop(ctx context.Context, iface net.Interface) {
	waitCarrier(ctx, iface.Name, 3*time.Second)
	c := &dhcp6.Client{
		MAC: iface.HardwareAddr,
		// DAD on the link-local address takes about a second after the carrier comes up
		Open: func() (dhcp6.Transport, error) { return dhcp6.NewUDPTransport(iface.Name, 5*time.Second) },
		Hooks: dhcp6.Hooks{
			State: func(s dhcp6.State) { d := n.link6(iface.Name); n.mu.Lock(); d.state = s; n.mu.Unlock() },
			Bound: func(l dhcp6.Lease, renewed bool) { n.applyLease6(iface, l, renewed) },
			Lost:  func(l dhcp6.Lease, reason string) { n.dropLease6(iface, l, reason) },
		},
	}
	c.Run(ctx)
	if ctx.Err() != nil {
		n.endDHCP6(iface)
	}
}

// applyLease6 puts a DHCPv6 address on the interface as a /128, replacing the previous
// lease's; its DNS servers are used when neither the config nor a DHCPv4 lease names any.
func (n *Network) applyLease6(ifc net.Interface, l dhcp6.Lease, renewed bool) {
	ops, ok := n.linksFor(ifc.Name)
	if !ok {
		return
	}
	defer ops.Close()
	d := n.link6(ifc.Name)
	n.mu.Lock()
	old := d.addr
	n.mu.Unlock()
	addr := l.IPNet()
	if err := ops.addAddress(ifc.Index, addr); err != nil {
		n.say("network: %s: DHCPv6 address %s: %v", ifc.Name, addr, err)
		return
	}
	moved := old != nil && old.String() != addr.String()
	if moved {
		n.delAddress(ops, ifc, old)
		n.forget(ifc.Name, old.String())
	}
	n.mu.Lock()
	d.lease, d.addr = &l, addr
	if renewed {
		d.renewals++
	} else {
		d.renewals = 0
	}
	v4DNS := false
	for _, link := range n.links {
		v4DNS = v4DNS || link.lease != nil && len(link.lease.DNS) > 0
	}
	n.mu.Unlock()
	n.record(ifc.Name, addr.String())
	if old == nil || moved {
		n.say("network: %s: %s via DHCPv6 (valid %s)", ifc.Name, addr, l.Valid)
	}
	if !v4DNS {
		n.setDNS(ipStrings(l.DNS), false)
	}
}

// dropLease6 removes a lost DHCPv6 address; the client starts over.
func (n *Network) dropLease6(ifc net.Interface, l dhcp6.Lease, reason string) {
	d := n.link6(ifc.Name)
	n.mu.Lock()
	addr := d.addr
	d.lease, d.addr, d.renewals = nil, nil, 0
	n.mu.Unlock()
	n.say("network: %s: DHCPv6 address %s %s; removing it", ifc.Name, l.IPNet(), reason)
	if addr == nil {
		return
	}
	ops, ok := n.linksFor(ifc.Name)
	if !ok {
		return
	}
	defer ops.Close()
	n.delAddress(ops, ifc, addr)
	n.forget(ifc.Name, addr.String())
}
