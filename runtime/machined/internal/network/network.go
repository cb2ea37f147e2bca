// Package network brings machined's network up: loopback, then each configured interface
// statically or by DHCP (internal/dhcp) and DHCPv6 (internal/dhcp6), with the MTU, addresses and routes set over
// rtnetlink and the nameservers written to /run/resolv.conf. DHCP leases are kept for as
// long as machined runs: renewed, replaced when they change, removed when they are lost.
package network

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"kiln/machined/internal/dhcp"
	"kiln/machined/internal/persist"
	"kiln/machined/internal/safego"
)

const (
	rtprotStatic = 4                  // RTPROT_STATIC
	rtprotDHCP   = 16                 // RTPROT_DHCP
	resolvConf   = "/run/resolv.conf" // /etc/resolv.conf links here (pkgs/fhs)
)

// Network brings interfaces up: loopback always, then each configured interface (or,
// with no network config, every Ethernet interface) statically or by DHCP. DHCP leases
// are renewed in the background for as long as machined runs.
type Network struct {
	say       func(string, ...interface{})
	mu        sync.Mutex
	addrs     map[string][]string // interface -> CIDRs, for /v1/status
	dns       []string
	staticDNS bool
	dhcp      map[string]*loop     // interfaces with a DHCP client running
	links     map[string]*dhcpLink // interface -> its DHCP state
	dhcp6     map[string]*loop     // interfaces with a DHCPv6 client running
	links6    map[string]*dhcp6Link
	applyMu   sync.Mutex               // one Apply or Configure at a time
	static    map[string]staticApplied // interface -> what the last Apply set on it (apply.go)
	lookup    func(name string) (*net.Interface, error)
	// runDHCP and runDHCP6 are the clients' loops (dhcpLoop, dhcp6Loop); tests stand in for them
	runDHCP    func(ctx context.Context, iface net.Interface, first chan struct{})
	runDHCP6   func(ctx context.Context, iface net.Interface)
	resolvConf string
	openLinks  func() (linkOps, error) // rtnetlink; a recorder in tests
	now        func() time.Time
	// metadataIface names the interface that serves the metadata, the only one whose DHCP
	// routes may cover 169.254.0.0/16 (linklocal.go); nil: none
	metadataIface func() string
}

// New returns a Network that reports on say; Configure brings the interfaces up.
func New(say func(string, ...interface{})) *Network {
	n := &Network{say: say, addrs: map[string][]string{}, dhcp: map[string]*loop{}, links: map[string]*dhcpLink{},
		dhcp6: map[string]*loop{}, links6: map[string]*dhcp6Link{}, static: map[string]staticApplied{},
		resolvConf: resolvConf, openLinks: openLinkOps, now: time.Now, lookup: net.InterfaceByName}
	n.runDHCP, n.runDHCP6 = n.dhcpLoop, n.dhcp6Loop
	return n
}

// ethernetInterfaces lists /sys/class/net entries of type Ethernet (ARPHRD_ETHER).
func ethernetInterfaces(sysRoot string) []string {
	entries, _ := os.ReadDir(filepath.Join(sysRoot, "class", "net"))
	var out []string
	for _, e := range entries {
		if readUint(filepath.Join(sysRoot, "class", "net", e.Name(), "type")) == 1 {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// Configure adds what cfg says to what the interfaces have (the boot's first steps: DHCP
// everywhere to reach a config URL or a metadata service) and waits up to wait for the first
// DHCP leases, so the ready line usually comes with an address; slow servers finish in the
// background. Apply, not Configure, makes the interfaces exactly what the machine config says.
// Configures and Applies run one at a time (the config URL's fetch and the platform's may both
// want DHCP at once).
func (n *Network) Configure(cfg NetworkConfig, wait time.Duration) {
	n.applyMu.Lock()
	defer n.applyMu.Unlock()
	n.configure(cfg, wait)
}

// configure brings up each interface cfg names (every Ethernet interface when it names none),
// with its static addresses and routes, and starts DHCP and DHCPv6 where they are wanted and
// not running; it returns what it set statically per interface.
func (n *Network) configure(cfg NetworkConfig, wait time.Duration) map[string]staticApplied {
	applied := map[string]staticApplied{}
	ops, err := n.openLinks()
	if err != nil {
		n.say("network: %v", err)
		return applied
	}
	defer ops.Close()
	if lo, err := n.lookup("lo"); err == nil {
		_ = ops.linkUp(lo.Index)
		_ = ops.addAddress(lo.Index, &net.IPNet{IP: net.IPv4(127, 0, 0, 1), Mask: net.CIDRMask(8, 32)})
	}
	n.setDNS(cfg.Nameservers, true)
	var wg sync.WaitGroup
	for _, ic := range n.interfaces(cfg) {
		iface, err := n.lookup(ic.Name)
		if err != nil {
			n.say("network: interface %s: %v", ic.Name, err)
			continue
		}
		if err := ops.linkUp(iface.Index); err != nil {
			n.say("network: %s up: %v", ic.Name, err)
			continue
		}
		applied[ic.Name] = n.applyStatic(ops, *iface, ic)
		if ic.UsesDHCP() {
			n.setConfig(ic)
		}
		if ic.UsesDHCP6() {
			n.startDHCP6(*iface) // not waited for; a no-op where it runs already
		}
		if first := n.startDHCP(*iface, ic.UsesDHCP()); first != nil {
			wg.Add(1)
			safego.Go("dhcp wait "+ic.Name, func() { <-first; wg.Done() })
		}
	}
	done := make(chan struct{})
	safego.Go("network wait", func() { wg.Wait(); close(done) })
	select {
	case <-done:
	case <-time.After(wait):
		n.say("network: no DHCP lease yet after %s; still trying in the background", wait)
	}
	return applied
}

// interfaces is what cfg configures: its interfaces, or every Ethernet interface with DHCP.
func (n *Network) interfaces(cfg NetworkConfig) []InterfaceConfig {
	if len(cfg.Interfaces) > 0 {
		return cfg.Interfaces
	}
	var all []InterfaceConfig
	for _, name := range ethernetInterfaces("/sys") {
		all = append(all, InterfaceConfig{Name: name})
	}
	return all
}

// applyStatic applies the config's MTU, addresses and routes, and returns what the kernel took.
func (n *Network) applyStatic(ops linkOps, ifc net.Interface, ic InterfaceConfig) staticApplied {
	var done staticApplied
	if ic.MTU > 0 {
		if err := ops.setMTU(ifc.Index, ic.MTU); err != nil {
			n.say("network: %s: MTU %d: %v", ic.Name, ic.MTU, err)
		}
	}
	for _, p := range ic.staticPrefixes() {
		p := p
		if err := ops.addAddress(ifc.Index, &p); err != nil {
			n.say("network: %s address %s: %v", ic.Name, p.String(), err)
			continue
		}
		n.record(ic.Name, p.String())
		done.prefixes = append(done.prefixes, p)
	}
	if len(ic.Addresses) > 0 { // with DHCP alone, the gateways are likely in the lease's subnet: applyLease adds them
		done.routes = n.addRoutes(ops, ifc, ic.staticPrefixes(), ic.staticRoutes())
	}
	if len(done.prefixes) > 0 {
		n.say("network: %s: %s (static)", ic.Name, prefixesText(done.prefixes))
	}
	return done
}

func (n *Network) record(ifname, cidr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, a := range n.addrs[ifname] {
		if a == cidr {
			return
		}
	}
	n.addrs[ifname] = append(n.addrs[ifname], cidr)
}

// forget drops an address from status once a lease no longer has it.
func (n *Network) forget(ifname, cidr string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	kept := n.addrs[ifname][:0]
	for _, a := range n.addrs[ifname] {
		if a != cidr {
			kept = append(kept, a)
		}
	}
	n.addrs[ifname] = kept
}

// setDNS writes /run/resolv.conf; nameservers from the config win over DHCP's.
func (n *Network) setDNS(servers []string, fromConfig bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(servers) == 0 || (!fromConfig && n.staticDNS) || strings.Join(servers, " ") == strings.Join(n.dns, " ") {
		return
	}
	n.staticDNS = n.staticDNS || fromConfig
	n.dns = servers
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	// atomically: a resolver reading it mid-write would see no or half the servers
	if err := persist.WriteFileAtomic(n.resolvConf, []byte(b.String()), 0o644); err != nil {
		n.say("network: %s: %v", n.resolvConf, err)
	}
}

// startDHCP starts the interface's DHCP client when want says so and none runs, and returns a
// channel closed at its first lease (nil when nothing was started). The client runs again
// should it panic (a hostile DHCP answer must not leave the interface without renewals); a
// restart gets a fresh first channel, since the panicking run has closed the old one. It runs
// until Apply stops it.
func (n *Network) startDHCP(iface net.Interface, want bool) chan struct{} {
	if !want {
		return nil
	}
	l := n.startLoop(n.dhcp, iface.Name)
	if l == nil {
		return nil
	}
	first := make(chan struct{})
	next := first
	safego.Forever("dhcp "+iface.Name, func() {
		defer l.finish()
		if l.ctx.Err() != nil {
			return
		}
		ch := next
		next = make(chan struct{})
		n.runDHCP(l.ctx, iface, ch)
	})
	return first
}

// dhcpLoop runs the interface's DHCP client until ctx ends, applying each lease it gets and
// removing each it loses; first is closed at the first lease so Configure can stop waiting.
// When ctx ends (the config turned DHCP off here), the lease it holds is removed.
func (n *Network) dhcpLoop(ctx context.Context, iface net.Interface, first chan struct{}) {
	once := sync.Once{}
	signalFirst := func() { once.Do(func() { close(first) }) }
	defer signalFirst()
	waitCarrier(ctx, iface.Name, 3*time.Second)
	c := &dhcp.Client{
		MAC:  iface.HardwareAddr,
		Open: func() (dhcp.Transport, error) { return dhcp.NewUDPTransport(iface.Name) },
		Hooks: dhcp.Hooks{
			State: func(s dhcp.State) { n.setState(iface.Name, s) },
			Bound: func(l dhcp.Lease, renewed bool) { n.applyLease(iface, l, renewed); signalFirst() },
			Lost:  func(l dhcp.Lease, reason string) { n.dropLease(iface, l, reason) },
		},
	}
	c.Run(ctx)
	if ctx.Err() != nil {
		n.endDHCP(iface)
	}
}

// waitCarrier waits briefly for the link to come up after IFF_UP (virtio is instant,
// real NICs take a moment); DHCP is tried either way.
func waitCarrier(ctx context.Context, ifname string, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if readUint(filepath.Join("/sys/class/net", ifname, "carrier")) == 1 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Addresses returns interface -> CIDRs.
func (n *Network) Addresses() map[string][]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string][]string{}
	for k, v := range n.addrs {
		out[k] = append([]string(nil), v...)
	}
	return out
}

// readUint reads a number from sysfs, 0 when there is none (internal/disk has the same).
func readUint(path string) uint64 {
	data, _ := os.ReadFile(path)
	n, _ := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	return n
}
