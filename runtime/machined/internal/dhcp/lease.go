package dhcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

const (
	defaultLease = time.Hour
	// minLease keeps a server's zero or tiny lease time from making the client renew in a loop.
	minLease = 20 * time.Second
	// minMTU is the smallest MTU option 26 may carry (RFC 2132 §5.1).
	minMTU = 576
)

// Route is a classless static route (option 121, or Microsoft's 249). Option 33 (classful
// static routes) is neither asked for nor read. The network code takes a route covering
// 169.254.0.0/16 only on the interface that serves the metadata (internal/network/linklocal.go).
type Route struct {
	Dst     net.IPNet
	Gateway net.IP // nil: the destination is on the link (the option said 0.0.0.0)
}

// OnLink says whether the destination is reached without a gateway.
func (r Route) OnLink() bool { return r.Gateway == nil }

func (r Route) String() string {
	if r.OnLink() {
		return r.Dst.String() + " on-link"
	}
	return r.Dst.String() + " via " + r.Gateway.String()
}

// Lease is what an ACK gives. Options that were missing or malformed are left empty.
type Lease struct {
	IP   net.IP
	Mask net.IPMask
	// Router is option 3's first router, nil when Routes is set: RFC 3442 says a client that
	// gets classless routes ignores option 3.
	Router   net.IP
	Routes   []Route // option 121, else 249
	DNS      []net.IP
	NTP      []net.IP
	Hostname string // option 12, kept for whoever wants it, not applied
	Domain   string // option 15, likewise
	MTU      int    // option 26; 0 when not given
	ServerID net.IP
	// Start is when the REQUEST that got this lease was sent: the times below count from it.
	Start  time.Time
	Lease  time.Duration
	Renew  time.Duration // T1
	Rebind time.Duration // T2
}

// IPNet is the leased address with its prefix.
func (l Lease) IPNet() *net.IPNet { return &net.IPNet{IP: l.IP, Mask: l.Mask} }

// Expiry is when the lease ends unless renewed.
func (l Lease) Expiry() time.Time { return l.Start.Add(l.Lease) }

// leaseFrom reads the lease an ACK carries. Only a missing or unusable address is an
// error; every other option is dropped alone when it is malformed.
func leaseFrom(p packet, start time.Time) (Lease, error) {
	ip := p.yiaddr.To4()
	if !usableAddress(ip) {
		return Lease{}, fmt.Errorf("the server offered %v, which is not a usable address", p.yiaddr)
	}
	l := Lease{IP: ip, Mask: net.CIDRMask(24, 32), ServerID: p.serverID(), Start: start}
	if m, ok := subnetMask(p.options[optSubnetMask]); ok {
		l.Mask = m
	}
	l.Routes = classlessRoutesOf(p.options)
	if len(l.Routes) == 0 {
		l.Router, _ = firstIPv4(p.options[optRouter])
	}
	l.DNS, _ = ipv4List(p.options[optDNS])
	l.NTP, _ = ipv4List(p.options[optNTP])
	l.Hostname, _ = dnsName(p.options[optHostname])
	l.Domain, _ = dnsName(p.options[optDomain])
	l.MTU, _ = mtu(p.options[optMTU])
	l.setTimes(p.options)
	return l, nil
}

// usableAddress rejects what a hostile or broken server could offer that would break the
// machine: no address, broadcast, multicast, loopback.
func usableAddress(ip net.IP) bool {
	return ip != nil && !ip.IsUnspecified() && !ip.Equal(net.IPv4bcast) && !ip.IsMulticast() && !ip.IsLoopback()
}

// setTimes reads options 51, 58 and 59 and makes them consistent: T1 < T2 < lease, with
// RFC 2131's defaults (0.5 and 0.875 of the lease) for missing or impossible values.
func (l *Lease) setTimes(opts map[byte][]byte) {
	l.Lease = defaultLease
	if d, ok := seconds(opts[optLeaseTime]); ok {
		l.Lease = d
	}
	if l.Lease < minLease {
		l.Lease = minLease
	}
	l.Rebind = l.Lease / 8 * 7
	if d, ok := seconds(opts[optRebindingTime]); ok && d > 0 && d < l.Lease {
		l.Rebind = d
	}
	l.Renew = l.Lease / 2
	if d, ok := seconds(opts[optRenewalTime]); ok && d > 0 && d <= l.Rebind {
		l.Renew = d
	}
	if l.Renew > l.Rebind {
		l.Renew = l.Rebind
	}
}

// classlessRoutesOf reads option 121, or 249 when 121 is absent or malformed.
func classlessRoutesOf(opts map[byte][]byte) []Route {
	if r, ok := classlessRoutes(opts[optClasslessRoutes]); ok {
		return r
	}
	r, _ := classlessRoutes(opts[optMSClasslessRoutes])
	return r
}

var errMalformed = errors.New("malformed option")

// classlessRoutes decodes RFC 3442's format: per route a prefix length, the significant
// octets of the destination, then the gateway. Any bad entry drops the whole option, since
// half a routing table can be worse than none.
func classlessRoutes(v []byte) ([]Route, bool) {
	if len(v) == 0 {
		return nil, false
	}
	var routes []Route
	for len(v) > 0 {
		r, rest, err := classlessRoute(v)
		if err != nil {
			return nil, false
		}
		routes = append(routes, r)
		v = rest
	}
	return routes, true
}

func classlessRoute(v []byte) (Route, []byte, error) {
	width := int(v[0])
	if width > 32 {
		return Route{}, nil, errMalformed
	}
	n := (width + 7) / 8
	if len(v) < 1+n+4 {
		return Route{}, nil, errMalformed
	}
	mask := net.CIDRMask(width, 32)
	dst := make(net.IP, 4)
	copy(dst, v[1:1+n])
	gw := net.IP(append([]byte(nil), v[1+n:1+n+4]...))
	r := Route{Dst: net.IPNet{IP: dst.Mask(mask), Mask: mask}} // the RFC wants the bits past the prefix zero; make sure
	switch {
	case gw.IsUnspecified():
	case gw.Equal(net.IPv4bcast) || gw.IsMulticast():
		return Route{}, nil, errMalformed
	default:
		r.Gateway = gw
	}
	return r, v[1+n+4:], nil
}

// subnetMask accepts only a contiguous mask: another would make no sense as a prefix.
func subnetMask(v []byte) (net.IPMask, bool) {
	if len(v) != 4 {
		return nil, false
	}
	m := net.IPMask(append([]byte(nil), v...))
	if ones, bits := m.Size(); bits != 32 || ones == 0 {
		return nil, false
	}
	return m, true
}

func ipv4List(v []byte) ([]net.IP, bool) {
	if len(v) == 0 || len(v)%4 != 0 {
		return nil, false
	}
	var out []net.IP
	for ; len(v) >= 4; v = v[4:] {
		out = append(out, net.IP(append([]byte(nil), v[:4]...)))
	}
	return out, true
}

func firstIPv4(v []byte) (net.IP, bool) {
	ips, ok := ipv4List(v)
	if !ok || ips[0].IsUnspecified() {
		return nil, false
	}
	return ips[0], true
}

func oneIPv4(v []byte) (net.IP, bool) {
	if len(v) != 4 {
		return nil, false
	}
	return firstIPv4(v)
}

func seconds(v []byte) (time.Duration, bool) {
	if len(v) != 4 {
		return 0, false
	}
	return time.Duration(binary.BigEndian.Uint32(v)) * time.Second, true
}

func mtu(v []byte) (int, bool) {
	if len(v) != 2 {
		return 0, false
	}
	m := int(binary.BigEndian.Uint16(v))
	if m < minMTU {
		return 0, false
	}
	return m, true
}

// dnsName accepts a host or domain name made of letters, digits, '-', '_' and '.': the value
// ends up in logs and status, where control characters from a hostile server have no place.
// Some servers add a trailing NUL, which is dropped.
func dnsName(v []byte) (string, bool) {
	s := strings.TrimRight(string(v), "\x00")
	if s == "" || len(s) > 253 {
		return "", false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return "", false
		}
	}
	return s, true
}
