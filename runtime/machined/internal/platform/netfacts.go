package platform

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Everything that goes into a Network passes through these: an address that does not parse
// is dropped with a warning, so machined's network layer only ever sees valid values.

// parseIP returns the canonical text of an IP address.
func parseIP(s string) (string, bool) {
	ip := net.ParseIP(strings.TrimSpace(s))
	if ip == nil {
		return "", false
	}
	return ip.String(), true
}

func isIPv4(s string) bool {
	ip := net.ParseIP(s)
	return ip != nil && ip.To4() != nil
}

// hostCIDR returns "ip/prefix" for an address with its prefix, keeping the host bits.
func hostCIDR(s string) (string, bool) {
	ip, ipnet, err := net.ParseCIDR(strings.TrimSpace(s))
	if err != nil {
		return "", false
	}
	ones, _ := ipnet.Mask.Size()
	return ip.String() + "/" + strconv.Itoa(ones), true
}

// networkCIDR returns the network a CIDR names, host bits cleared ("10.1.2.3/8" is 10.0.0.0/8).
// v4 says whether it is an IPv4 network.
func networkCIDR(s string) (cidr string, v4 bool, ok bool) {
	_, ipnet, err := net.ParseCIDR(strings.TrimSpace(s))
	if err != nil {
		return "", false, false
	}
	return ipnet.String(), len(ipnet.IP) == net.IPv4len, true
}

// prefixLen reads a netmask as a dotted IPv4 mask, an IPv6 mask or a prefix length, for an
// address of the given family; a non-contiguous mask is invalid.
func prefixLen(mask string, v4 bool) (int, bool) {
	mask = strings.TrimPrefix(strings.TrimSpace(mask), "/")
	bits := 128
	if v4 {
		bits = 32
	}
	if n, err := strconv.Atoi(mask); err == nil {
		return n, n >= 0 && n <= bits
	}
	ip := net.ParseIP(mask)
	if ip == nil {
		return 0, false
	}
	var m net.IPMask
	if v4 {
		if ip.To4() == nil {
			return 0, false
		}
		m = net.IPMask(ip.To4())
	} else {
		if ip.To4() != nil {
			return 0, false
		}
		m = net.IPMask(ip.To16())
	}
	ones, size := m.Size()
	return ones, size == bits
}

// joinCIDR makes "ip/prefix" from an address and a netmask (or prefix length); an address
// may carry its prefix instead, or both if they agree.
func joinCIDR(addr, mask string) (string, bool) {
	addr = strings.TrimSpace(addr)
	if strings.Contains(addr, "/") {
		cidr, ok := hostCIDR(addr)
		if !ok || mask == "" {
			return cidr, ok
		}
		// both given: they must agree
		n, ok := prefixLen(mask, isIPv4(cidr[:strings.IndexByte(cidr, '/')]))
		return cidr, ok && strings.HasSuffix(cidr, "/"+strconv.Itoa(n))
	}
	ip, ok := parseIP(addr)
	if !ok {
		return "", false
	}
	n, ok := prefixLen(mask, isIPv4(ip))
	if !ok {
		return "", false
	}
	return ip + "/" + strconv.Itoa(n), true
}

// parseMAC returns a MAC in lower-case colon form.
func parseMAC(s string) (string, bool) {
	hw, err := net.ParseMAC(strings.TrimSpace(s))
	if err != nil || len(hw) != 6 {
		return "", false
	}
	return hw.String(), true
}

// parseMTU accepts what a link can carry: IPv4's minimum to the largest jumbo frame.
func parseMTU(s string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	return n, err == nil && n >= 68 && n <= 65535
}

// ifaceBuilder adds validated values to an Interface, warning about each one it drops.
type ifaceBuilder struct {
	f   *facts
	doc string
	Interface
}

func (b *ifaceBuilder) addAddress(addr, mask string) bool {
	if strings.TrimSpace(addr) == "" {
		return false
	}
	cidr, ok := joinCIDR(addr, mask)
	if !ok {
		b.f.warn("%s: address %s with netmask %s is not valid; dropped", b.doc, quoteShort(addr), quoteShort(mask))
		return false
	}
	for _, a := range b.Addresses {
		if a == cidr {
			return true
		}
	}
	b.Addresses = append(b.Addresses, cidr)
	return true
}

// addGateway sets the IPv4 default gateway, or adds an IPv6 default route.
func (b *ifaceBuilder) addGateway(gw string) {
	if strings.TrimSpace(gw) == "" {
		return
	}
	ip, ok := parseIP(gw)
	switch {
	case !ok:
		b.f.warn("%s: gateway %s is not an IP address; dropped", b.doc, quoteShort(gw))
	case isIPv4(ip) && b.Gateway == "":
		b.Gateway = ip
	case isIPv4(ip):
		if ip != b.Gateway {
			b.f.warn("%s: a second IPv4 gateway %s; dropped", b.doc, ip)
		}
	default:
		b.addRoute("::/0", ip)
	}
}

// addRoute adds a route to network to (CIDR) via gw ("" on-link); a default IPv4 route with
// a gateway becomes the interface's Gateway.
func (b *ifaceBuilder) addRoute(to, gw string) {
	cidr, v4, ok := networkCIDR(to)
	if !ok {
		b.f.warn("%s: route destination %s is not a CIDR; dropped", b.doc, quoteShort(to))
		return
	}
	via := ""
	if strings.TrimSpace(gw) != "" {
		if via, ok = parseIP(gw); !ok {
			b.f.warn("%s: route via %s is not an IP address; dropped", b.doc, quoteShort(gw))
			return
		}
		if isIPv4(via) != v4 {
			b.f.warn("%s: route to %s via %s mixes address families; dropped", b.doc, cidr, via)
			return
		}
	}
	if cidr == "0.0.0.0/0" && via != "" {
		b.addGateway(via)
		return
	}
	r := Route{To: cidr, Via: via}
	for _, have := range b.Routes {
		if have == r {
			return
		}
	}
	b.Routes = append(b.Routes, r)
}

func (b *ifaceBuilder) setMTU(s string) {
	if strings.TrimSpace(s) == "" {
		return
	}
	if n, ok := parseMTU(s); ok {
		b.MTU = n
	} else {
		b.f.warn("%s: MTU %s is not a number from 68 to 65535; dropped", b.doc, quoteShort(s))
	}
}

// addNameservers adds valid, new nameserver addresses to n.
func addNameservers(f *facts, doc string, n *Network, servers ...string) {
	for _, s := range servers {
		if strings.TrimSpace(s) == "" {
			continue
		}
		ip, ok := parseIP(s)
		if !ok {
			f.warn("%s: nameserver %s is not an IP address; dropped", doc, quoteShort(s))
			continue
		}
		dup := false
		for _, have := range n.Nameservers {
			dup = dup || have == ip
		}
		if !dup && len(n.Nameservers) < 16 {
			n.Nameservers = append(n.Nameservers, ip)
		}
	}
}

// finishNetwork returns n, or nil when it holds nothing DHCP would not give anyway.
func finishNetwork(n *Network) *Network {
	if n == nil {
		return nil
	}
	if len(n.Nameservers) > 0 {
		return n
	}
	for _, i := range n.Interfaces {
		if len(i.Addresses) > 0 || len(i.Routes) > 0 || i.Gateway != "" || i.MTU != 0 {
			return n
		}
	}
	return nil
}

// text is a JSON value read as text: a string, a number (as written) or null. Services
// differ on whether an ID or a prefix is "64" or 64; an object or a list is an error.
type text string

func (t *text) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*t = ""
		return nil
	}
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*t = text(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(data, &n); err != nil {
		return fmt.Errorf("want a string or a number, got %.20s", data)
	}
	*t = text(n)
	return nil
}

func (t text) String() string { return string(t) }

// decodeJSON decodes one bounded JSON document, naming the platform and document on error.
func decodeJSON(platform, doc string, data []byte, v interface{}) error {
	if len(data) > MaxDocument {
		return docError(platform, doc, fmt.Errorf("%d bytes is more than the %d allowed", len(data), MaxDocument))
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return docError(platform, doc, errEmpty)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return docError(platform, doc, fmt.Errorf("invalid JSON: %v", err))
	}
	return nil
}
