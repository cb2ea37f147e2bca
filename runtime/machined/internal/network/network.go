// Package network brings machined's network up: loopback, then each configured interface
// statically or by DHCP (internal/dhcp), with the addresses and routes set over rtnetlink and
// the nameservers written to /run/resolv.conf.
package network

import (
	"fmt"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	dhcp      map[string]bool // interfaces with a DHCP loop running
}

// New returns a Network that reports on say; Configure brings the interfaces up.
func New(say func(string, ...interface{})) *Network {
	return &Network{say: say, addrs: map[string][]string{}, dhcp: map[string]bool{}}
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
		for _, a := range ic.Addresses {
			ip, ipnet, _ := net.ParseCIDR(a) // validated with the config
			ipnet.IP = ip
			if err := nl.addAddress(iface.Index, ipnet); err != nil {
				n.say("network: %s address %s: %v", ic.Name, a, err)
				continue
			}
			n.record(ic.Name, a)
		}
		if ic.Gateway != "" {
			if err := nl.addDefaultRoute(iface.Index, net.ParseIP(ic.Gateway), rtprotStatic); err != nil {
				n.say("network: %s gateway %s: %v", ic.Name, ic.Gateway, err)
			}
		}
		n.mu.Lock()
		running := n.dhcp[ic.Name]
		n.dhcp[ic.Name] = n.dhcp[ic.Name] || ic.UsesDHCP()
		n.mu.Unlock()
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
	if err := persist.WriteFileAtomic(resolvConf, []byte(b.String()), 0o644); err != nil {
		n.say("network: %s: %v", resolvConf, err)
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

// dhcpLoop gets a lease, applies it, and renews it at T1; first is closed after the first
// attempt (lease or not) so Configure can stop waiting.
func (n *Network) dhcpLoop(iface net.Interface, first chan struct{}) {
	once := sync.Once{}
	signalFirst := func() { once.Do(func() { close(first) }) }
	defer signalFirst()
	waitCarrier(iface.Name, 3*time.Second)
	retry := 5 * time.Second
	for {
		lease, err := n.dhcpOnce(iface, 10*time.Second)
		if err != nil {
			signalFirst()
			time.Sleep(retry)
			if retry < time.Minute {
				retry *= 2
			}
			continue
		}
		retry = 5 * time.Second
		signalFirst()
		time.Sleep(lease.Renew)
	}
}

func (n *Network) dhcpOnce(iface net.Interface, timeout time.Duration) (dhcp.Lease, error) {
	t, err := dhcp.NewUDPTransport(iface.Name)
	if err != nil {
		return dhcp.Lease{}, err
	}
	defer t.Close()
	lease, err := dhcp.Exchange(t, iface.HardwareAddr, rand.Uint32(), time.Now().Add(timeout))
	if err != nil {
		return lease, err
	}
	nl, err := openNetlink()
	if err != nil {
		return lease, err
	}
	defer nl.Close()
	if err := nl.addAddress(iface.Index, lease.IPNet()); err != nil {
		n.say("network: %s: DHCP address %s: %v", iface.Name, lease.IPNet(), err)
		return lease, err
	}
	if lease.Router != nil {
		if err := nl.addDefaultRoute(iface.Index, lease.Router, rtprotDHCP); err != nil && err != syscall.EEXIST {
			n.say("network: %s: route via %s: %v", iface.Name, lease.Router, err)
		}
	}
	cidr := lease.IPNet().String()
	n.mu.Lock()
	known := false
	for _, a := range n.addrs[iface.Name] {
		known = known || a == cidr
	}
	n.mu.Unlock()
	if !known {
		n.record(iface.Name, cidr)
		n.say("network: %s: %s via DHCP (router %v, lease %s)", iface.Name, cidr, lease.Router, lease.Lease)
	}
	var dns []string
	for _, ip := range lease.DNS {
		dns = append(dns, ip.String())
	}
	n.setDNS(dns, false)
	return lease, nil
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
