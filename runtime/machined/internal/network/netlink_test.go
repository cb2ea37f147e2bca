package network

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln/machined/internal/dhcp"
	"kiln/machined/internal/testkit"
)

// inNetns runs fn on a thread in a fresh network namespace, so the host's network is
// untouched. It needs root (CAP_SYS_ADMIN) and skips otherwise. fn must not start
// goroutines that touch the network: they would run in the host's namespace.
func inNetns(t *testing.T, fn func(nl *netlinkConn)) {
	t.Helper()
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root for a network namespace")
	}
	done := make(chan struct{})
	skip := ""
	go func() {
		defer close(done)
		// this thread enters the namespace and is never unlocked, so Go retires it after
		runtime.LockOSThread()
		if err := syscall.Unshare(syscall.CLONE_NEWNET); err != nil {
			skip = "no network namespace here (a restricted container?): " + err.Error()
			return
		}
		nl, err := openNetlink()
		if err != nil {
			t.Error(err)
			return
		}
		defer nl.Close()
		fn(nl)
	}()
	<-done
	if skip != "" {
		testkit.Unavailable(t, "%s", skip)
	}
}

// The netlink requests against a real kernel.
func TestNetlinkInANetworkNamespace(t *testing.T) {
	inNetns(t, func(nl *netlinkConn) {
		lo, err := net.InterfaceByName("lo")
		if err != nil {
			t.Error(err)
			return
		}
		if lo.Flags&net.FlagUp != 0 {
			t.Error("lo starts down in a new namespace")
		}
		if err := nl.linkUp(lo.Index); err != nil {
			t.Errorf("link up: %v", err)
			return
		}
		ip, ipnet, _ := net.ParseCIDR("10.77.0.5/24")
		ipnet.IP = ip
		if err := nl.addAddress(lo.Index, ipnet); err != nil {
			t.Errorf("address: %v", err)
			return
		}
		if err := nl.addAddress(lo.Index, ipnet); err != nil {
			t.Errorf("adding the same address again (a DHCP renewal) must succeed: %v", err)
		}
		if err := nl.addDefaultRoute(lo.Index, net.IPv4(10, 77, 0, 1), rtprotDHCP); err != nil {
			t.Errorf("route: %v", err)
			return
		}
		lo, _ = net.InterfaceByName("lo")
		addrs, _ := lo.Addrs()
		if lo.Flags&net.FlagUp == 0 || !strings.Contains(addrsString(addrs), "10.77.0.5/24") {
			t.Errorf("lo: %v %v", lo.Flags, addrs)
		}
		if got := kernelRoutes(t, "lo"); !contains(got, "0.0.0.0/0 via 10.77.0.1") {
			t.Errorf("no default route via 10.77.0.1: %q", got)
		}
		if err := nl.addAddress(999, ipnet); err == nil {
			t.Error("an address on a missing interface must fail")
		}
	})
}

// The route, address and MTU requests, and the errors applyLease and dropLease ignore.
func TestNetlinkRoutesAndMTU(t *testing.T) {
	inNetns(t, func(nl *netlinkConn) {
		ifc := addVeth(t, nl, "kd0", "kd0p")
		if ifc == nil {
			return
		}
		if err := nl.linkUp(ifc.Index); err != nil { // gateway routes need the device up
			t.Error(err)
		}
		addr := &net.IPNet{IP: net.IPv4(10, 20, 0, 5).To4(), Mask: net.CIDRMask(32, 32)}
		gw := via("0.0.0.0/0", "10.20.0.1")
		host := hostRoute(net.IPv4(10, 20, 0, 1), rtprotDHCP)
		steps := []struct {
			name string
			err  error
			want syscall.Errno
		}{
			{"mtu", nl.setMTU(ifc.Index, 1400), 0},
			{"address", nl.addAddress(ifc.Index, addr), 0},
			{"gateway before its host route", nl.addRoute(ifc.Index, gw), syscall.ENETUNREACH},
			{"host route", nl.addRoute(ifc.Index, host), 0},
			{"default route", nl.addRoute(ifc.Index, gw), 0},
			{"default route again", nl.addRoute(ifc.Index, gw), 0},
			{"delete with another protocol", nl.delRoute(ifc.Index, route{dst: gw.dst, gw: gw.gw, proto: rtprotStatic}), syscall.ESRCH},
			{"delete with another gateway", nl.delRoute(ifc.Index, via("0.0.0.0/0", "10.20.0.9")), syscall.ESRCH},
		}
		for _, s := range steps {
			if errno, _ := s.err.(syscall.Errno); s.err != nil && errno != s.want || s.err == nil && s.want != 0 {
				t.Errorf("%s: %v, want %v", s.name, s.err, s.want)
			}
		}
		if got := kernelRoutes(t, "kd0"); strings.Join(got, ", ") != "0.0.0.0/0 via 10.20.0.1, 10.20.0.1/32 on-link" {
			t.Errorf("routes %q", got)
		}
		if ifc, _ := net.InterfaceByName("kd0"); ifc.MTU != 1400 {
			t.Errorf("MTU %d", ifc.MTU)
		}
		if err := nl.delRoute(ifc.Index, gw); err != nil {
			t.Errorf("delete: %v", err)
		}
		if err := nl.delRoute(ifc.Index, gw); err != syscall.ESRCH {
			t.Errorf("delete again: %v, want ESRCH", err)
		}
		if err := nl.delAddress(ifc.Index, addr); err != nil {
			t.Errorf("delete address: %v", err)
		}
		if err := nl.delAddress(ifc.Index, addr); err != syscall.EADDRNOTAVAIL {
			t.Errorf("delete address again: %v, want EADDRNOTAVAIL", err)
		}
		if err := nl.setMTU(999, 1500); err == nil {
			t.Error("an MTU on a missing interface must fail")
		}
	})
}

// Configure with a static /32 and a gateway outside it (a cloud's metadata), then a DHCP
// lease applied, moved and lost on another interface.
func TestConfigureStaticAndLeasesInANetworkNamespace(t *testing.T) {
	inNetns(t, func(nl *netlinkConn) {
		if addVeth(t, nl, "kd0", "kd0p") == nil || addVeth(t, nl, "kd1", "kd1p") == nil {
			return
		}
		n := New(t.Logf)
		n.resolvConf = filepath.Join(t.TempDir(), "resolv.conf")
		n.Configure(NetworkConfig{Interfaces: []InterfaceConfig{{Name: "kd0", Addresses: []string{"10.20.0.5/32"}, Gateway: "10.20.0.1",
			MTU: 1460, Routes: []RouteConfig{{To: "192.0.2.0/24", Via: "10.20.0.1"}, {To: "198.51.100.0/24"}}}}}, time.Second)
		want := "0.0.0.0/0 via 10.20.0.1, 10.20.0.1/32 on-link, 192.0.2.0/24 via 10.20.0.1, 198.51.100.0/24 on-link"
		if got := strings.Join(kernelRoutes(t, "kd0"), ", "); got != want {
			t.Errorf("static routes:\n%s\nwant\n%s", got, want)
		}
		kd0, _ := net.InterfaceByName("kd0")
		addrs, _ := kd0.Addrs()
		if kd0.MTU != 1460 || kd0.Flags&net.FlagUp == 0 || addrsString(addrs) != "10.20.0.5/32" {
			t.Errorf("kd0: mtu %d, %v, %v", kd0.MTU, kd0.Flags, addrs)
		}

		kd1, _ := net.InterfaceByName("kd1")
		_ = nl.linkUp(kd1.Index)
		l := gcpLease("10.30.0.5")
		l.Routes = []dhcp.Route{{Dst: cidr("203.0.113.0/24"), Gateway: net.IPv4(10, 30, 0, 1).To4()}}
		n.applyLease(*kd1, l, false)
		if got := strings.Join(kernelRoutes(t, "kd1"), ", "); got != "10.30.0.1/32 on-link, 203.0.113.0/24 via 10.30.0.1" {
			t.Errorf("lease routes: %s", got)
		}
		moved := gcpLease("10.30.0.9")
		moved.Routes = []dhcp.Route{{Dst: cidr("10.30.0.1/32")}, {Dst: cidr("198.18.0.0/15")}, {Dst: cidr("203.0.113.0/24"), Gateway: net.IPv4(10, 30, 0, 1).To4()}}
		n.applyLease(*kd1, moved, true)
		if got := strings.Join(kernelRoutes(t, "kd1"), ", "); got != "10.30.0.1/32 on-link, 198.18.0.0/15 on-link, 203.0.113.0/24 via 10.30.0.1" {
			t.Errorf("after the move: %s", got)
		}
		kd1, _ = net.InterfaceByName("kd1")
		if addrs, _ := kd1.Addrs(); addrsString(addrs) != "10.30.0.9/32" || kd1.MTU != 1460 {
			t.Errorf("kd1 after the move: %v, mtu %d", addrs, kd1.MTU)
		}
		n.dropLease(*kd1, moved, "expired")
		if got := kernelRoutes(t, "kd1"); len(got) != 0 {
			t.Errorf("routes left after the lease was lost: %q", got)
		}
		if addrs, _ := kd1.Addrs(); len(addrs) != 0 {
			t.Errorf("addresses left after the lease was lost: %v", addrs)
		}
		if got := strings.Join(kernelRoutes(t, "kd0"), ", "); !strings.Contains(got, "10.20.0.1/32 on-link, 192.0.2.0/24 via 10.20.0.1") {
			t.Errorf("kd0's routes must not be touched: %s", got)
		}
	})
}

// addVeth creates a veth pair and returns the name end (RTM_NEWLINK with IFLA_LINKINFO's
// kind "veth" and the peer's name in VETH_INFO_PEER). Dummy links would do, but kernels
// built without them are common in CI.
func addVeth(t *testing.T, nl *netlinkConn, name, peer string) *net.Interface {
	const iflaInfoKind, iflaInfoData, vethInfoPeer = 1, 2, 1
	peerMsg := attr(make([]byte, syscall.SizeofIfInfomsg), syscall.IFLA_IFNAME, append([]byte(peer), 0))
	info := attr(nil, iflaInfoKind, []byte("veth"))
	info = attr(info, iflaInfoData, attr(nil, vethInfoPeer, peerMsg))
	body := make([]byte, syscall.SizeofIfInfomsg)
	body = attr(body, syscall.IFLA_IFNAME, append([]byte(name), 0))
	body = attr(body, syscall.IFLA_LINKINFO, info)
	if err := nl.request(syscall.RTM_NEWLINK, syscall.NLM_F_CREATE|syscall.NLM_F_EXCL, body); err != nil {
		t.Errorf("veth %s: %v", name, err)
		return nil
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		t.Error(err)
		return nil
	}
	return ifc
}

// kernelRoutes reads the calling thread's main routing table for one interface, sorted,
// as "dst/len via gw" or "dst/len on-link".
func kernelRoutes(t *testing.T, ifname string) []string {
	return procRoutes(t, "route", ifname, func(f []string) (string, procRoute) {
		if len(f) < 8 {
			return "", procRoute{}
		}
		ones, _ := net.IPMask(hexIP(f[7])).Size()
		return f[0], procRoute{dst: hexIP(f[1]), ones: ones, gw: hexIP(f[2])}
	})
}

// procRoute is one route of /proc/thread-self/net/route or ipv6_route.
type procRoute struct {
	dst  net.IP
	ones int
	gw   net.IP
}

// procRoutes reads the calling thread's routes from /proc/thread-self/net/file for one
// interface, sorted, as "dst/len via gw" or "dst/len on-link"; fields reads a line's
// interface and route (no interface: not a route).
func procRoutes(t *testing.T, file, ifname string, fields func(f []string) (string, procRoute)) []string {
	data, err := os.ReadFile("/proc/thread-self/net/" + file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		name, r := fields(strings.Fields(line))
		if name != ifname {
			continue
		}
		s := fmt.Sprintf("%s/%d on-link", r.dst, r.ones)
		if !r.gw.IsUnspecified() {
			s = fmt.Sprintf("%s/%d via %s", r.dst, r.ones, r.gw)
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// hexIP reads /proc/net/route's addresses: network order printed as a host-endian number.
func hexIP(h string) net.IP {
	v, _ := strconv.ParseUint(h, 16, 32)
	ip := make(net.IP, 4)
	hostEndian.PutUint32(ip, uint32(v))
	return ip
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func addrsString(addrs []net.Addr) string {
	var s []string
	for _, a := range addrs {
		s = append(s, a.String())
	}
	return strings.Join(s, " ")
}

// IPv6 addresses and routes against a real kernel: a static address, a default route via a
// link-local gateway, a route via a global gateway behind its host route, replacing and
// deleting them. Both veth ends are up, so the address leaves DAD's tentative state.
func TestNetlinkIPv6InANetworkNamespace(t *testing.T) {
	inNetns(t, func(nl *netlinkConn) {
		ifc := addVeth(t, nl, "kd0", "kd0p")
		peer, err := net.InterfaceByName("kd0p")
		if ifc == nil || err != nil {
			t.Error(err)
			return
		}
		for _, i := range []int{ifc.Index, peer.Index} {
			if err := nl.linkUp(i); err != nil {
				t.Error(err)
			}
		}
		_, p, _ := net.ParseCIDR("2001:db8:5::10/64")
		addr := &net.IPNet{IP: net.ParseIP("2001:db8:5::10"), Mask: p.Mask}
		host := &net.IPNet{IP: net.ParseIP("2001:db8:6::7"), Mask: net.CIDRMask(128, 128)}
		def := RouteConfig{To: "::/0", Via: "fe80::1"}
		far := RouteConfig{To: "2001:db8:7::/48", Via: "2001:db8:9::1"}
		steps := []struct {
			name string
			err  error
			want syscall.Errno
		}{
			{"address", nl.addAddress(ifc.Index, addr), 0},
			{"address again", nl.addAddress(ifc.Index, addr), 0},
			{"a /128", nl.addAddress(ifc.Index, host), 0},
			{"default via link-local", nl.addRoute(ifc.Index, mustRoute(t, def)), 0},
			{"default again", nl.addRoute(ifc.Index, mustRoute(t, def)), 0},
			{"gateway before its host route", nl.addRoute(ifc.Index, mustRoute(t, far)), syscall.EHOSTUNREACH},
			{"host route", nl.addRoute(ifc.Index, hostRoute(net.ParseIP("2001:db8:9::1"), rtprotStatic)), 0},
			{"via the global gateway", nl.addRoute(ifc.Index, mustRoute(t, far)), 0},
			{"delete with another protocol", nl.delRoute(ifc.Index, route{dst: mustRoute(t, def).dst, gw: net.ParseIP("fe80::1"), proto: rtprotDHCP}), syscall.ESRCH},
			{"delete with another gateway", nl.delRoute(ifc.Index, mustRoute(t, RouteConfig{To: "::/0", Via: "fe80::2"})), syscall.ESRCH},
		}
		for _, s := range steps {
			if errno, _ := s.err.(syscall.Errno); s.err != nil && errno != s.want || s.err == nil && s.want != 0 {
				t.Errorf("%s: %v, want %v", s.name, s.err, s.want)
			}
		}
		got := kernelRoutes6(t, "kd0")
		for _, want := range []string{"::/0 via fe80::1", "2001:db8:5::/64 on-link", "2001:db8:9::1/128 on-link", "2001:db8:7::/48 via 2001:db8:9::1"} {
			if !contains(got, want) {
				t.Errorf("no route %q in %q", want, got)
			}
		}
		addrs, _ := ifc.Addrs()
		if s := addrsString(addrs); !strings.Contains(s, "2001:db8:5::10/64") || !strings.Contains(s, "2001:db8:6::7/128") {
			t.Errorf("addresses %s", s)
		}
		if err := nl.delRoute(ifc.Index, mustRoute(t, def)); err != nil {
			t.Errorf("delete: %v", err)
		}
		if got := kernelRoutes6(t, "kd0"); contains(got, "::/0 via fe80::1") {
			t.Errorf("default route left: %q", got)
		}
		if err := nl.delAddress(ifc.Index, host); err != nil {
			t.Errorf("delete address: %v", err)
		}
		if err := nl.delAddress(ifc.Index, host); err != syscall.EADDRNOTAVAIL {
			t.Errorf("delete address again: %v, want EADDRNOTAVAIL", err)
		}
		if addrs, _ := ifc.Addrs(); strings.Contains(addrsString(addrs), "2001:db8:6::7") {
			t.Errorf("address left: %v", addrs)
		}
	})
}

// Configure with static IPv4 and IPv6 addresses and an IPv6 default route via a link-local
// gateway, as DigitalOcean, Hetzner and Vultr describe their machines.
func TestConfigureStaticIPv6InANetworkNamespace(t *testing.T) {
	inNetns(t, func(nl *netlinkConn) {
		if addVeth(t, nl, "kd0", "kd0p") == nil {
			return
		}
		peer, _ := net.InterfaceByName("kd0p")
		_ = nl.linkUp(peer.Index)
		n := New(t.Logf)
		n.resolvConf = filepath.Join(t.TempDir(), "resolv.conf")
		n.Configure(NetworkConfig{Interfaces: []InterfaceConfig{{Name: "kd0", Addresses: []string{"192.0.2.10/24", "2001:db8:5::10/64"},
			Gateway: "192.0.2.1", Routes: []RouteConfig{{To: "::/0", Via: "fe80::1"}}}}, Nameservers: []string{"2001:db8::53", "192.0.2.53"}}, time.Second)
		if got := kernelRoutes6(t, "kd0"); !contains(got, "::/0 via fe80::1") || !contains(got, "2001:db8:5::/64 on-link") {
			t.Errorf("IPv6 routes %q", got)
		}
		if got := kernelRoutes(t, "kd0"); !contains(got, "0.0.0.0/0 via 192.0.2.1") {
			t.Errorf("IPv4 routes %q", got)
		}
		if got := n.Addresses()["kd0"]; strings.Join(got, " ") != "192.0.2.10/24 2001:db8:5::10/64" {
			t.Errorf("addresses %v", got)
		}
		wantResolvConf(t, n, "nameserver 2001:db8::53\nnameserver 192.0.2.53\n")
	})
}

func mustRoute(t *testing.T, rc RouteConfig) route {
	r, err := rc.parse(rtprotStatic)
	if err != nil {
		t.Error(err)
	}
	return r
}

// kernelRoutes6 reads the calling thread's IPv6 routes for one interface (every table, so
// the local table's entries are there too), as "dst/len via gw" or "dst/len on-link".
func kernelRoutes6(t *testing.T, ifname string) []string {
	return procRoutes(t, "ipv6_route", ifname, func(f []string) (string, procRoute) {
		if len(f) < 10 {
			return "", procRoute{}
		}
		ones, _ := strconv.ParseUint(f[1], 16, 8)
		return f[9], procRoute{dst: hexIP6(f[0]), ones: int(ones), gw: hexIP6(f[4])}
	})
}

func hexIP6(h string) net.IP {
	ip := make(net.IP, 16)
	for i := range ip {
		if 2*i+2 <= len(h) {
			v, _ := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
			ip[i] = byte(v)
		}
	}
	return ip
}

// Apply on real interfaces: a second config's address and gateway replace the first's, and
// the first's are gone from the kernel.
func TestApplyInANetworkNamespace(t *testing.T) {
	inNetns(t, func(nl *netlinkConn) {
		if addVeth(t, nl, "kd0", "kd0p") == nil {
			return
		}
		n := New(t.Logf)
		n.resolvConf = filepath.Join(t.TempDir(), "resolv.conf")
		no := false
		first := NetworkConfig{Interfaces: []InterfaceConfig{{Name: "kd0", Addresses: []string{"10.40.0.5/24"}, Gateway: "10.40.0.1", DHCP: &no}}}
		n.Apply(first, time.Second)
		kd0, _ := net.InterfaceByName("kd0")
		if addrs, _ := kd0.Addrs(); addrsString(addrs) != "10.40.0.5/24" {
			t.Fatalf("kd0 after the first config: %v", addrs)
		}
		second := NetworkConfig{Interfaces: []InterfaceConfig{{Name: "kd0", Addresses: []string{"10.50.0.7/24"}, Gateway: "10.50.0.1", DHCP: &no}}}
		n.Apply(second, time.Second)
		if addrs, _ := kd0.Addrs(); addrsString(addrs) != "10.50.0.7/24" {
			t.Errorf("kd0 after the second config: %v", addrs)
		}
		if got := strings.Join(kernelRoutes(t, "kd0"), ", "); got != "0.0.0.0/0 via 10.50.0.1, 10.50.0.0/24 on-link" { // the kernel's prefix route beside it
			t.Errorf("kd0's routes after the second config: %s", got)
		}
		if got := n.Addresses()["kd0"]; len(got) != 1 || got[0] != "10.50.0.7/24" {
			t.Errorf("status addresses: %v", got)
		}
	})
}
