package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"syscall"
)

// A few rtnetlink requests (rtnetlink(7)): link up and MTU, add and remove IPv4 and IPv6
// addresses and routes. That is all machined's network setup needs, and the standard library has the
// socket but no messages. Netlink is host-endian; Kiln's architectures (amd64, arm64) are little.

var hostEndian = binary.LittleEndian

type netlinkConn struct {
	fd  int
	seq uint32
}

func openNetlink() (*netlinkConn, error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %v", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("netlink bind: %v", err)
	}
	return &netlinkConn{fd: fd}, nil
}

func (c *netlinkConn) Close() { syscall.Close(c.fd) }

// request sends one message and waits for the kernel's acknowledgement.
func (c *netlinkConn) request(msgType uint16, flags uint16, body []byte) error {
	c.seq++
	msg := make([]byte, syscall.NLMSG_HDRLEN, syscall.NLMSG_HDRLEN+len(body))
	msg = append(msg, body...)
	hostEndian.PutUint32(msg[0:], uint32(len(msg)))
	hostEndian.PutUint16(msg[4:], msgType)
	hostEndian.PutUint16(msg[6:], flags|syscall.NLM_F_REQUEST|syscall.NLM_F_ACK)
	hostEndian.PutUint32(msg[8:], c.seq)
	if err := syscall.Sendto(c.fd, msg, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := syscall.Recvfrom(c.fd, buf, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != c.seq || m.Header.Type != syscall.NLMSG_ERROR {
				continue
			}
			if len(m.Data) < 4 {
				return fmt.Errorf("short netlink error message")
			}
			if errno := int32(hostEndian.Uint32(m.Data[0:4])); errno != 0 {
				return syscall.Errno(-errno)
			}
			return nil
		}
	}
}

// attr appends one rtattr (length, type, payload, padded to 4 bytes).
func attr(b []byte, typ uint16, payload []byte) []byte {
	l := 4 + len(payload)
	hdr := make([]byte, 4)
	hostEndian.PutUint16(hdr[0:], uint16(l))
	hostEndian.PutUint16(hdr[2:], typ)
	b = append(b, hdr...)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// linkUp sets IFF_UP on an interface.
func (c *netlinkConn) linkUp(index int) error {
	body := make([]byte, syscall.SizeofIfInfomsg)
	body[0] = syscall.AF_UNSPEC
	hostEndian.PutUint32(body[4:], uint32(index))
	hostEndian.PutUint32(body[8:], syscall.IFF_UP)  // flags
	hostEndian.PutUint32(body[12:], syscall.IFF_UP) // change mask
	return c.request(syscall.RTM_NEWLINK, 0, body)
}

// addAddress adds (or refreshes) an IPv4 address with its broadcast address, or an IPv6
// address (with duplicate address detection, as the kernel does it by default).
func (c *netlinkConn) addAddress(index int, ipnet *net.IPNet) error {
	if ipnet.IP.To4() == nil {
		body, err := addressMessage6(index, ipnet)
		if err != nil {
			return err
		}
		return c.request(syscall.RTM_NEWADDR, syscall.NLM_F_CREATE|syscall.NLM_F_REPLACE, body)
	}
	body, ip4, ones, err := addressMessage(index, ipnet)
	if err != nil {
		return err
	}
	body[3] = syscall.RT_SCOPE_UNIVERSE
	if ip4[0] == 127 {
		body[3] = syscall.RT_SCOPE_HOST
	}
	body = attr(body, syscall.IFA_ADDRESS, ip4)
	bcast := make(net.IP, 4)
	mask := net.IP(ipnet.Mask).To4()
	if len(ipnet.Mask) == 16 {
		mask = net.IP(ipnet.Mask[12:])
	}
	for i := range bcast {
		bcast[i] = ip4[i] | ^mask[i]
	}
	if ones < 31 {
		body = attr(body, syscall.IFA_BROADCAST, bcast)
	}
	return c.request(syscall.RTM_NEWADDR, syscall.NLM_F_CREATE|syscall.NLM_F_REPLACE, body)
}

// addDefaultRoute routes 0.0.0.0/0 via gw on the interface (replacing an older default).
func (c *netlinkConn) addDefaultRoute(index int, gw net.IP, protocol byte) error {
	if gw.To4() == nil {
		return fmt.Errorf("gateway %s is not IPv4", gw)
	}
	return c.addRoute(index, route{dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, gw: gw.To4(), proto: protocol})
}

// addRoute adds r on the interface, replacing a route to the same destination (a renewed
// lease moving its default route to another gateway replaces rather than adds).
func (c *netlinkConn) addRoute(index int, r route) error {
	body, err := routeMessage(index, r)
	if err != nil {
		return err
	}
	return c.request(syscall.RTM_NEWROUTE, syscall.NLM_F_CREATE|syscall.NLM_F_REPLACE, body)
}

// delRoute removes r. The message names its gateway, scope and protocol, so the kernel
// removes only that route, never another to the same destination.
func (c *netlinkConn) delRoute(index int, r route) error {
	body, err := routeMessage(index, r)
	if err != nil {
		return err
	}
	return c.request(syscall.RTM_DELROUTE, 0, body)
}

// routeMessage is an rtmsg with the destination, the gateway (none: on-link, scope link for
// IPv4) and the output interface, which says on which link an IPv6 gateway (link-local, as
// may be) is.
func routeMessage(index int, r route) ([]byte, error) {
	family, bits, name := byte(syscall.AF_INET), 32, "IPv4"
	if r.v6() {
		family, bits, name = syscall.AF_INET6, 128, "IPv6"
	}
	dst := familyIP(r.dst.IP, bits)
	ones, size := r.dst.Mask.Size()
	if dst == nil || size != bits {
		return nil, fmt.Errorf("route to %s: not an %s prefix", r.dst.String(), name)
	}
	body := make([]byte, syscall.SizeofRtMsg)
	body[0] = family
	body[1] = byte(ones)
	body[4] = syscall.RT_TABLE_MAIN
	body[5] = r.proto
	body[6] = r.scope()
	body[7] = syscall.RTN_UNICAST
	if ones > 0 {
		body = attr(body, syscall.RTA_DST, dst)
	}
	if r.gw != nil {
		gw := familyIP(r.gw, bits)
		if gw == nil {
			return nil, fmt.Errorf("gateway %s is not %s", r.gw, name)
		}
		body = attr(body, syscall.RTA_GATEWAY, gw)
	}
	oif := make([]byte, 4)
	hostEndian.PutUint32(oif, uint32(index))
	return attr(body, syscall.RTA_OIF, oif), nil
}

// familyIP is ip as an address of bits bits (32: IPv4, 128: IPv6), nil when it is not one.
func familyIP(ip net.IP, bits int) net.IP {
	if bits == 32 {
		return ip.To4()
	}
	if ip.To4() != nil {
		return nil
	}
	return ip.To16()
}

// delAddress removes an address (a lease that expired or moved).
func (c *netlinkConn) delAddress(index int, ipnet *net.IPNet) error {
	if ipnet.IP.To4() == nil {
		body, err := addressMessage6(index, ipnet)
		if err != nil {
			return err
		}
		return c.request(syscall.RTM_DELADDR, 0, body)
	}
	body, _, _, err := addressMessage(index, ipnet)
	if err != nil {
		return err
	}
	return c.request(syscall.RTM_DELADDR, 0, body)
}

// addressMessage is the ifaddrmsg (family, prefix length, interface) and IFA_LOCAL that
// adding and removing an IPv4 address share.
func addressMessage(index int, ipnet *net.IPNet) (body []byte, ip4 net.IP, ones int, err error) {
	ip4 = ipnet.IP.To4()
	if ip4 == nil {
		return nil, nil, 0, fmt.Errorf("%s is not IPv4", ipnet)
	}
	ones, _ = ipnet.Mask.Size()
	body = make([]byte, syscall.SizeofIfAddrmsg)
	body[0] = syscall.AF_INET
	body[1] = byte(ones)
	hostEndian.PutUint32(body[4:], uint32(index))
	return attr(body, syscall.IFA_LOCAL, ip4), ip4, ones, nil
}

// addressMessage6 is the ifaddrmsg and the address for IPv6. The kernel reads an IPv6
// address from IFA_ADDRESS (IFA_LOCAL would name a point-to-point peer as well); the scope
// follows from the address.
func addressMessage6(index int, ipnet *net.IPNet) ([]byte, error) {
	ip6 := ipnet.IP.To16()
	ones, bits := ipnet.Mask.Size()
	if ip6 == nil || ipnet.IP.To4() != nil || bits != 128 {
		return nil, fmt.Errorf("%s is not an IPv6 prefix", ipnet)
	}
	body := make([]byte, syscall.SizeofIfAddrmsg)
	body[0] = syscall.AF_INET6
	body[1] = byte(ones)
	body[3] = syscall.RT_SCOPE_UNIVERSE
	hostEndian.PutUint32(body[4:], uint32(index))
	return attr(body, syscall.IFA_ADDRESS, ip6), nil
}

// setMTU sets the interface's MTU (IFLA_MTU), as DHCP option 26 or the config asks.
func (c *netlinkConn) setMTU(index int, mtu int) error {
	body := make([]byte, syscall.SizeofIfInfomsg)
	body[0] = syscall.AF_UNSPEC
	hostEndian.PutUint32(body[4:], uint32(index))
	v := make([]byte, 4)
	hostEndian.PutUint32(v, uint32(mtu))
	body = attr(body, syscall.IFLA_MTU, v)
	return c.request(syscall.RTM_NEWLINK, 0, body)
}
