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
	say        func(string, ...interface{})
	mu         sync.Mutex
	addrs      map[string][]string // interface -> CIDRs, for /v1/status
	dns        []string
	staticDNS  bool
	dhcp       map[string]bool      // interfaces with a DHCP loop running
	links      map[string]*dhcpLink // interface -> its DHCP state
	dhcp6      map[string]bool      // interfaces with a DHCPv6 loop running
	links6     map[string]*dhcp6Link
	resolvConf string
	openLinks  func() (linkOps, error) // rtnetlink; a recorder in tests
	now        func() time.Time
	// metadataIface names the interface that serves the metadata, the only one whose DHCP
	// routes may cover 169.254.0.0/16 (linklocal.go); nil: none
	metadataIface func() string
}

// New returns a Network that reports on say; Configure brings the interfaces up.
func New(say func(string, ...interface{})) *Network {
	return &Network{say: say, addrs: map[string][]string{}, dhcp: map[string]bool{}, links: map[string]*dhcpLink{},
		dhcp6: map[string]bool{}, links6: map[string]*dhcp6Link{}, resolvConf: resolvConf, openLinks: openLinkOps, now: time.Now}
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

// Configure applies the config and waits up to wait for the first DHCP leases, so the
// ready line usually comes with an address; slow servers finish in the background.
func (n *Network) Configure(cfg NetworkConfig, wait time.Duration) {
	nl, err := openNetlink()
	if err != nil {
		n.say("network: %v", err)
		return
	}
	defer nl.Close()
	if lo, err := net.InterfaceByName("lo"); err == nil {
		_ = nl.linkUp(lo.Index)
		_ = nl.addAddress(lo.Index, &net.IPNet{IP: net.IPv4(127, 0, 0, 1), Mask: net.CIDRMask(8, 32)})
	}
	n.setDNS(cfg.Nameservers, true)
	ifaces := cfg.Interfaces
	if len(ifaces) == 0 {
		for _, name := range ethernetInterfaces("/sys") {
			ifaces = append(ifaces, InterfaceConfig{Name: name})
		}
	}
	var wg sync.WaitGroup
	for _, ic := range ifaces {
		iface, err := net.InterfaceByName(ic.Name)
		if err != nil {
			n.say("network: interface %s: %v", ic.Name, err)
			continue
		}
		if err := nl.linkUp(iface.Index); err != nil {
			n.say("network: %s up: %v", ic.Name, err)
			continue
		}
		n.applyStatic(nl, *iface, ic)
		if ic.UsesDHCP() {
			n.setConfig(ic)
		}
		n.mu.Lock()
		running := n.dhcp[ic.Name]
		n.dhcp[ic.Name] = n.dhcp[ic.Name] || ic.UsesDHCP()
		running6 := n.dhcp6[ic.Name]
		n.dhcp6[ic.Name] = n.dhcp6[ic.Name] || ic.UsesDHCP6()
		n.mu.Unlock()
		if ic.UsesDHCP6() && !running6 {
			n.startDHCP6(*iface) // not waited for
		}
		if ic.UsesDHCP() && !running {
			wg.Add(1)
			first := make(chan struct{})
			n.startDHCP(*iface, first)
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
}

// applyStatic applies the config's MTU, addresses and routes.
func (n *Network) applyStatic(ops linkOps, ifc net.Interface, ic InterfaceConfig) {
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
	}
	if len(ic.Addresses) > 0 { // with DHCP alone, the gateways are likely in the lease's subnet: applyLease adds them
		n.addRoutes(ops, ifc, ic.staticPrefixes(), ic.staticRoutes())
	}
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

// startDHCP runs dhcpLoop and runs it again should it panic (a hostile DHCP answer must not
// leave the interface without renewals); a restart gets a fresh first channel, since the
// panicking run has closed the old one.
func (n *Network) startDHCP(iface net.Interface, first chan struct{}) {
	next := first
	safego.Forever("dhcp "+iface.Name, func() {
		ch := next
		next = make(chan struct{})
		n.dhcpLoop(iface, ch)
	})
}

// dhcpLoop runs the interface's DHCP client for good, applying each lease it gets and
// removing each it loses; first is closed at the first lease so Configure can stop waiting.
func (n *Network) dhcpLoop(iface net.Interface, first chan struct{}) {
	once := sync.Once{}
	signalFirst := func() { once.Do(func() { close(first) }) }
	defer signalFirst()
	waitCarrier(iface.Name, 3*time.Second)
	c := &dhcp.Client{
		MAC:  iface.HardwareAddr,
		Open: func() (dhcp.Transport, error) { return dhcp.NewUDPTransport(iface.Name) },
		Hooks: dhcp.Hooks{
			State: func(s dhcp.State) { n.setState(iface.Name, s) },
			Bound: func(l dhcp.Lease, renewed bool) { n.applyLease(iface, l, renewed); signalFirst() },
			Lost:  func(l dhcp.Lease, reason string) { n.dropLease(iface, l, reason) },
		},
	}
	c.Run(context.Background())
}

// waitCarrier waits briefly for the link to come up after IFF_UP (virtio is instant,
// real NICs take a moment); DHCP is tried either way.
func waitCarrier(ifname string, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
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
