package network

import (
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// The netlink requests against a real kernel, in a fresh network namespace so the host's
// network is untouched. Needs root (CAP_SYS_ADMIN); skipped otherwise.
func TestNetlinkInANetworkNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
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
		routes, _ := os.ReadFile("/proc/thread-self/net/route")
		// default route (destination 00000000) via 10.77.0.1 (0100 4D0A in little-endian hex)
		if !strings.Contains(string(routes), "00000000\t01004D0A") {
			t.Errorf("no default route via 10.77.0.1:\n%s", routes)
		}
		if err := nl.addAddress(999, ipnet); err == nil {
			t.Error("an address on a missing interface must fail")
		}
	}()
	<-done
	if skip != "" {
		t.Skip(skip)
	}
}

func addrsString(addrs []net.Addr) string {
	var s []string
	for _, a := range addrs {
		s = append(s, a.String())
	}
	return strings.Join(s, " ")
}
