package network

import (
	"net"
	"strings"
)

// linkLocal4 is IPv4's link-local block: cloud metadata services (169.254.169.254, AWS's time
// service 169.254.169.123) live in it, and whatever routes it reads their answers, user data
// (the machine's config) included.
var linkLocal4 = net.IPNet{IP: net.IPv4(169, 254, 0, 0).To4(), Mask: net.CIDRMask(16, 32)}

// coversLinkLocal says whether a route's destination overlaps 169.254.0.0/16 more narrowly
// than a default route does: a route into the block (169.254.169.254/32), the block itself, or
// a wider prefix short of /0 holding it (128.0.0.0/1). A default route is the router's job
// and is not counted.
func coversLinkLocal(r route) bool {
	if r.v6() {
		return false
	}
	ones, _ := r.dst.Mask.Size()
	if ones == 0 {
		return false
	}
	return linkLocal4.Contains(r.dst.IP) || r.dst.Contains(linkLocal4.IP)
}

// SetMetadataInterface says which interface serves the platform's metadata (a func, asked
// when a lease comes, since interfaces appear while the machine boots; "" means none). DHCP
// routes covering 169.254.0.0/16 (option 121, or 249) are taken only on that interface: a
// lease on any other one, from a network the metadata does not come from, must not capture
// 169.254.169.254 before the metadata fetch. Without a call no interface takes them. Call it
// before Configure.
func (n *Network) SetMetadataInterface(which func() string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.metadataIface = which
}

// splitLinkLocal drops the routes covering 169.254.0.0/16 unless iface serves the metadata.
func (n *Network) splitLinkLocal(iface string, routes []route) (kept, ignored []route) {
	n.mu.Lock()
	which := n.metadataIface
	n.mu.Unlock()
	allowed := which != nil && which() == iface && iface != ""
	for _, r := range routes {
		if coversLinkLocal(r) && !allowed {
			ignored = append(ignored, r)
			continue
		}
		kept = append(kept, r)
	}
	return kept, ignored
}

// ignoredText lists ignored routes for the console.
func ignoredText(routes []route) string {
	var parts []string
	for _, r := range routes {
		parts = append(parts, r.String())
	}
	return strings.Join(parts, ", ")
}

// isIgnored says whether r is one of ignored (by destination and gateway).
func isIgnored(r route, ignored []route) bool {
	for _, o := range ignored {
		if o.String() == r.String() {
			return true
		}
	}
	return false
}
