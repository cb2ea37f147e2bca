package network

import (
	"net"
	"syscall"

	"kiln/machined/internal/dhcp"
)

// route is one IPv4 or IPv6 route through an interface (dst.IP and gw: 4 bytes for IPv4, 16 for IPv6).
type route struct {
	dst   net.IPNet
	gw    net.IP // nil: on-link
	proto byte   // rtprotStatic or rtprotDHCP: whose route it is
}

// scope is link for an on-link IPv4 route and universe for one through a gateway, as the
// kernel expects; IPv6 routes are all universe.
func (r route) scope() byte {
	if r.gw == nil && !r.v6() {
		return syscall.RT_SCOPE_LINK
	}
	return syscall.RT_SCOPE_UNIVERSE
}

func (r route) v6() bool { return r.dst.IP.To4() == nil }

func (r route) String() string {
	if r.gw == nil {
		return r.dst.String() + " on-link"
	}
	return r.dst.String() + " via " + r.gw.String()
}

// config is the route as status and the config show it.
func (r route) config() RouteConfig {
	rc := RouteConfig{To: r.dst.String()}
	if r.gw != nil {
		rc.Via = r.gw.String()
	}
	return rc
}

// hostRoute is an on-link /32 (IPv6: /128) to ip.
func hostRoute(ip net.IP, proto byte) route {
	if ip4 := ip.To4(); ip4 != nil {
		return route{dst: net.IPNet{IP: ip4, Mask: net.CIDRMask(32, 32)}, proto: proto}
	}
	return route{dst: net.IPNet{IP: ip.To16(), Mask: net.CIDRMask(128, 128)}, proto: proto}
}

// defaultRoute is 0.0.0.0/0 via gw.
func defaultRoute(gw net.IP, proto byte) route {
	return route{dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, gw: gw.To4(), proto: proto}
}

// leaseRoutes are the routes a lease asks for: its classless routes, else a default route
// via its router.
func leaseRoutes(l dhcp.Lease) []route {
	var out []route
	for _, r := range l.Routes {
		rt := route{dst: r.Dst, proto: rtprotDHCP}
		if !r.OnLink() {
			rt.gw = r.Gateway.To4()
		}
		out = append(out, rt)
	}
	if len(out) == 0 && l.Router != nil {
		out = append(out, defaultRoute(l.Router, rtprotDHCP))
	}
	return out
}

// planRoutes orders routes so the kernel takes each one: a gateway must be reachable when
// its route is added, so on-link routes come first, and a gateway outside the interface's
// prefixes and those routes gets an on-link host route of its own first. That is a cloud's
// /32 address with its gateway in no subnet of the machine (Google Compute Engine).
func planRoutes(prefixes []net.IPNet, routes []route) []route {
	var plan, viaGateway []route
	for _, r := range routes {
		if r.gw == nil {
			plan = append(plan, r)
		} else {
			viaGateway = append(viaGateway, r)
		}
	}
	for _, r := range viaGateway {
		if !onLink(r.gw, prefixes, plan) {
			plan = append(plan, hostRoute(r.gw, r.proto))
		}
	}
	return append(plan, viaGateway...)
}

// onLink says whether ip is inside one of the prefixes or the on-link routes, or is an IPv6
// link-local address (every IPv6 interface has fe80::/64 on the link).
func onLink(ip net.IP, prefixes []net.IPNet, routes []route) bool {
	if ip.To4() == nil && ip.IsLinkLocalUnicast() {
		return true
	}
	for _, p := range prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	for _, r := range routes {
		if r.gw == nil && r.dst.Contains(ip) {
			return true
		}
	}
	return false
}

// onLinkPrefixes are the destinations of the on-link routes: gateways in them are reachable.
func onLinkPrefixes(routes []route) []net.IPNet {
	var out []net.IPNet
	for _, r := range routes {
		if r.gw == nil {
			out = append(out, r.dst)
		}
	}
	return out
}

// sameDestination says whether some route in routes goes to r's destination (a route the
// kernel then replaced, which deleting would take away).
func sameDestination(r route, routes []route) bool {
	for _, o := range routes {
		if o.dst.String() == r.dst.String() {
			return true
		}
	}
	return false
}

// linkOps are the rtnetlink requests applying a config or a lease needs: netlinkConn on
// the machine, a recorder in tests.
type linkOps interface {
	linkUp(index int) error
	addAddress(index int, ipnet *net.IPNet) error
	delAddress(index int, ipnet *net.IPNet) error
	addRoute(index int, r route) error
	delRoute(index int, r route) error
	setMTU(index int, mtu int) error
	Close()
}

func openLinkOps() (linkOps, error) {
	c, err := openNetlink()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// addRoutes adds the plan for routes and returns the routes the kernel took.
func (n *Network) addRoutes(ops linkOps, ifc net.Interface, prefixes []net.IPNet, routes []route) []route {
	var added []route
	for _, r := range planRoutes(prefixes, routes) {
		if err := ops.addRoute(ifc.Index, r); err != nil {
			n.say("network: %s: route %s: %v", ifc.Name, r, err)
			continue
		}
		added = append(added, r)
	}
	return added
}

// delRoutes removes routes, last first (a gateway's host route goes after the routes using it).
func (n *Network) delRoutes(ops linkOps, ifc net.Interface, routes []route) {
	for i := len(routes) - 1; i >= 0; i-- {
		if err := ops.delRoute(ifc.Index, routes[i]); err != nil && err != syscall.ESRCH {
			n.say("network: %s: removing route %s: %v", ifc.Name, routes[i], err)
		}
	}
}
