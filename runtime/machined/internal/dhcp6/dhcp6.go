// Package dhcp6 is a DHCPv6 client (RFC 8415) for addresses only (IA_NA): it gets a lease
// (SOLICIT, ADVERTISE, REQUEST, REPLY) and keeps it (RENEW with its server at T1, REBIND
// with any server at T2, starting over when the address's valid lifetime ends or a server
// says it has no binding). It asks for DNS (option 23) and NTP servers (56, and SNTP 31).
// The on-link prefix and the default route come from router advertisements, which the
// kernel handles, so the address is used as a /128.
//
// Every message goes to All_DHCP_Relay_Agents_and_Servers (ff02::1:2) from the interface's
// link-local address: the Server Unicast option is not used, which RFC 8415 allows.
//
// The packet and lease code is pure and the lifecycle runs over a Transport and a Clock,
// as in internal/dhcp, so all of it is tested without sockets or real waits.
package dhcp6

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kiln/machined/internal/dhcp"
)

// Transport sends to the servers and receives their replies.
type Transport interface {
	// Send multicasts msg to the servers on the link.
	Send(msg []byte) error
	// Receive returns the next message, or an error once the deadline has passed.
	Receive(deadline time.Time) ([]byte, error)
	Close() error
}

// allServers is All_DHCP_Relay_Agents_and_Servers.
var allServers = net.ParseIP("ff02::1:2")

type udpTransport struct {
	conn   net.PacketConn
	ifname string
}

// NewUDPTransport opens the client socket on ifname: UDP port 546 on the interface's
// link-local address, sending to port 547. It waits up to wait for a link-local address
// that duplicate address detection has finished with (the kernel will not bind a
// tentative one).
func NewUDPTransport(ifname string, wait time.Duration) (Transport, error) {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, err
	}
	var ll net.IP
	deadline := time.Now().Add(wait)
	for {
		if ll = linkLocal(ifc.Index); ll != nil || !time.Now().Before(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ll == nil {
		return nil, fmt.Errorf("DHCPv6 on %s: no usable link-local address", ifname)
	}
	conn, err := dhcp.DeviceSocket(syscall.AF_INET6, ifname, "DHCPv6", func(fd int) error {
		if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_MULTICAST_IF, ifc.Index); err != nil {
			return err
		}
		sa := &syscall.SockaddrInet6{Port: 546, ZoneId: uint32(ifc.Index)}
		copy(sa.Addr[:], ll)
		return syscall.Bind(fd, sa)
	})
	if err != nil {
		return nil, err
	}
	return &udpTransport{conn: conn, ifname: ifname}, nil
}

// linkLocal is the interface's link-local address once it is usable (not tentative, not
// duplicate), from /proc/net/if_inet6: address, index, prefix length, scope, flags, name.
func linkLocal(index int) net.IP {
	f, err := os.Open("/proc/net/if_inet6")
	if err != nil {
		return nil
	}
	defer f.Close()
	const tentative, dadFailed = 0x40, 0x08 // IFA_F_TENTATIVE, IFA_F_DADFAILED
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 6 {
			continue
		}
		ifindex, _ := strconv.ParseUint(fields[1], 16, 32)
		flags, _ := strconv.ParseUint(fields[4], 16, 32)
		ip, err := hex.DecodeString(fields[0])
		if err != nil || len(ip) != 16 || int(ifindex) != index || flags&(tentative|dadFailed) != 0 {
			continue
		}
		if net.IP(ip).IsLinkLocalUnicast() {
			return ip
		}
	}
	return nil
}

func (u *udpTransport) Send(b []byte) error {
	_, err := u.conn.WriteTo(b, &net.UDPAddr{IP: allServers, Port: 547, Zone: u.ifname})
	return err
}

func (u *udpTransport) Receive(deadline time.Time) ([]byte, error) {
	return dhcp.Receive(u.conn, deadline)
}

func (u *udpTransport) Close() error { return u.conn.Close() }
