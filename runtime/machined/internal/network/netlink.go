package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"syscall"
)

// A few rtnetlink requests (rtnetlink(7)): link up, add an address, add a default route.
// That is all machined's network setup needs, and the standard library has the socket
// but no messages. Netlink is host-endian; Kiln's architectures (amd64, arm64) are little.

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

// addAddress adds (or refreshes) an IPv4 address with its broadcast address.
func (c *netlinkConn) addAddress(index int, ipnet *net.IPNet) error {
	ip4 := ipnet.IP.To4()
	if ip4 == nil {
		return fmt.Errorf("%s is not IPv4", ipnet)
	}
	ones, _ := ipnet.Mask.Size()
	body := make([]byte, syscall.SizeofIfAddrmsg)
	body[0] = syscall.AF_INET
	body[1] = byte(ones)
	body[3] = syscall.RT_SCOPE_UNIVERSE
	if ip4[0] == 127 {
		body[3] = syscall.RT_SCOPE_HOST
	}
	hostEndian.PutUint32(body[4:], uint32(index))
	body = attr(body, syscall.IFA_LOCAL, ip4)
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
	gw4 := gw.To4()
	if gw4 == nil {
		return fmt.Errorf("gateway %s is not IPv4", gw)
	}
	body := make([]byte, syscall.SizeofRtMsg)
	body[0] = syscall.AF_INET
	body[4] = syscall.RT_TABLE_MAIN
	body[5] = protocol
	body[6] = syscall.RT_SCOPE_UNIVERSE
	body[7] = syscall.RTN_UNICAST
	body = attr(body, syscall.RTA_GATEWAY, gw4)
	oif := make([]byte, 4)
	hostEndian.PutUint32(oif, uint32(index))
	body = attr(body, syscall.RTA_OIF, oif)
	return c.request(syscall.RTM_NEWROUTE, syscall.NLM_F_CREATE|syscall.NLM_F_REPLACE, body)
}
