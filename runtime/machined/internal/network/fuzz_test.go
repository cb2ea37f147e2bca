package network

import (
	"net"
	"testing"
)

// FuzzLinkLocalRoutes: whatever routes a lease asks for (five bytes each: a destination and a
// prefix length), off the metadata interface none that is taken reaches an address of
// 169.254.0.0/16 except through a default route, and every route is either taken or ignored.
func FuzzLinkLocalRoutes(f *testing.F) {
	f.Add([]byte{169, 254, 169, 254, 32, 0, 0, 0, 0, 0, 128, 0, 0, 0, 1}, []byte{12, 34})
	f.Add([]byte{169, 0, 0, 0, 8, 10, 0, 0, 0, 8}, []byte{169, 254})
	f.Fuzz(func(t *testing.T, spec []byte, probe []byte) {
		var routes []route
		for ; len(spec) >= 5; spec = spec[5:] {
			ones := int(spec[4]) % 33
			mask := net.CIDRMask(ones, 32)
			ip := net.IP(append([]byte(nil), spec[:4]...)).Mask(mask)
			routes = append(routes, route{dst: net.IPNet{IP: ip, Mask: mask}, gw: net.IPv4(10, 0, 0, 1).To4()})
		}
		addrs := []net.IP{net.IPv4(169, 254, 169, 254), net.IPv4(169, 254, 0, 0), net.IPv4(169, 254, 255, 255)}
		if len(probe) >= 2 {
			addrs = append(addrs, net.IPv4(169, 254, probe[0], probe[1]))
		}
		n := New(func(string, ...interface{}) {})
		n.SetMetadataInterface(func() string { return "eth0" })
		kept, ignored := n.splitLinkLocal("eth1", routes)
		if len(kept)+len(ignored) != len(routes) {
			t.Fatalf("%d routes became %d kept and %d ignored", len(routes), len(kept), len(ignored))
		}
		for _, r := range kept {
			if ones, _ := r.dst.Mask.Size(); ones == 0 {
				continue
			}
			for _, a := range addrs {
				if r.dst.Contains(a) {
					t.Fatalf("%s was taken off the metadata interface and routes %s", r, a)
				}
			}
		}
		all, none := n.splitLinkLocal("eth0", routes)
		if len(all) != len(routes) || len(none) != 0 {
			t.Fatal("the metadata interface lost routes")
		}
	})
}
