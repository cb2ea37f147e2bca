// Package dhcp is a DHCPv4 client (RFC 2131) for servers and cloud VMs: it gets a lease
// (DISCOVER, OFFER, REQUEST, ACK) and keeps it (renewing with its server at T1, rebinding
// with any server at T2, starting over when it expires or is refused). It reads the options
// clouds rely on: classless static routes (RFC 3442), MTU, DNS and NTP servers.
//
// The packet and lease code is pure and the lifecycle runs over a Transport and a Clock,
// so all of it is tested without sockets or real waits; udpTransport is the real socket.
package dhcp

import (
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// Transport sends to the servers and receives their replies: a UDP socket bound to the
// interface on the machine, an in-memory server in tests.
type Transport interface {
	// Send sends to the server at dst, or broadcasts when dst is nil.
	Send(msg []byte, dst net.IP) error
	// Receive returns the next message, or an error once the deadline has passed.
	Receive(deadline time.Time) ([]byte, error)
	Close() error
}

// udpTransport is a UDP socket on port 68 bound to one interface, sending to port 67.
type udpTransport struct{ conn net.PacketConn }

// NewUDPTransport opens the client socket on ifname. SO_BINDTODEVICE keeps the exchange on
// that interface; SO_BROADCAST lets it reach servers before it has an address.
func NewUDPTransport(ifname string) (Transport, error) {
	conn, err := DeviceSocket(syscall.AF_INET, ifname, "DHCP", func(fd int) error {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1); err != nil {
			return err
		}
		return syscall.Bind(fd, &syscall.SockaddrInet4{Port: 68})
	})
	if err != nil {
		return nil, err
	}
	return &udpTransport{conn: conn}, nil
}

// DeviceSocket opens a UDP socket of family (AF_INET, AF_INET6) on the interface ifname, with
// SO_REUSEADDR and SO_BINDTODEVICE, then bind (further options, and the bind); protocol
// ("DHCP", "DHCPv6") names it in an error.
func DeviceSocket(family int, ifname, protocol string, bind func(fd int) error) (net.PacketConn, error) {
	fd, err := syscall.Socket(family, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, syscall.IPPROTO_UDP)
	if err != nil {
		return nil, err
	}
	setup := func() error {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
			return err
		}
		if err := syscall.BindToDevice(fd, ifname); err != nil {
			return err
		}
		return bind(fd)
	}
	if err := setup(); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("%s socket on %s: %v", protocol, ifname, err)
	}
	f := os.NewFile(uintptr(fd), strings.ToLower(protocol)+"-"+ifname)
	defer f.Close()
	return net.FilePacketConn(f)
}

// Receive reads one datagram from conn until deadline: 4096 bytes at most, more than option
// 57 offers (a larger one is cut, not lost).
func Receive(conn net.PacketConn, deadline time.Time) ([]byte, error) {
	if err := conn.SetReadDeadline(deadline); err != nil {
		return nil, err
	}
	buf := make([]byte, 4096)
	n, _, err := conn.ReadFrom(buf)
	return buf[:n], err
}

func (u *udpTransport) Send(b []byte, dst net.IP) error {
	if dst == nil {
		dst = net.IPv4bcast
	}
	_, err := u.conn.WriteTo(b, &net.UDPAddr{IP: dst, Port: 67})
	return err
}

func (u *udpTransport) Receive(deadline time.Time) ([]byte, error) { return Receive(u.conn, deadline) }

func (u *udpTransport) Close() error { return u.conn.Close() }
