// Package dhcp is a DHCPv4 client (RFC 2131), just enough for a server or VM to get its address:
// DISCOVER, OFFER, REQUEST, ACK, with the broadcast flag so replies reach a socket on an interface
// that has no address yet. The packet code is pure and unit tested.
package dhcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

const (
	dhcpDiscover = 1
	dhcpOffer    = 2
	dhcpRequest  = 3
	dhcpAck      = 5
	dhcpNak      = 6

	optSubnetMask  = 1
	optRouter      = 3
	optDNS         = 6
	optHostname    = 12
	optRequestedIP = 50
	optLeaseTime   = 51
	optMessageType = 53
	optServerID    = 54
	optParamList   = 55
	optRenewalTime = 58
	optEnd         = 255
)

var (
	dhcpMagic = []byte{99, 130, 83, 99}
	errNak    = errors.New("the DHCP server refused the request (NAK)")
)

// Lease is what an ACK gives.
type Lease struct {
	IP       net.IP
	Mask     net.IPMask
	Router   net.IP
	DNS      []net.IP
	ServerID net.IP
	Lease    time.Duration
	Renew    time.Duration
}

func (l Lease) IPNet() *net.IPNet { return &net.IPNet{IP: l.IP, Mask: l.Mask} }

// dhcpPacket is a decoded BOOTP message.
type dhcpPacket struct {
	Op      byte
	XID     uint32
	YIAddr  net.IP
	CHAddr  net.HardwareAddr
	Options map[byte][]byte
}

func (p dhcpPacket) msgType() byte {
	if v := p.Options[optMessageType]; len(v) == 1 {
		return v[0]
	}
	return 0
}

// buildDHCP makes a client message; extra options are written in order.
type dhcpOption struct {
	code  byte
	value []byte
}

func buildDHCP(msgType byte, xid uint32, mac net.HardwareAddr, extra []dhcpOption) []byte {
	b := make([]byte, 240)
	b[0] = 1 // BOOTREQUEST
	b[1] = 1 // Ethernet
	b[2] = 6
	binary.BigEndian.PutUint32(b[4:], xid)
	binary.BigEndian.PutUint16(b[10:], 0x8000) // broadcast: we cannot receive unicast yet
	copy(b[28:], mac)
	copy(b[236:], dhcpMagic)
	b = append(b, optMessageType, 1, msgType)
	for _, o := range extra {
		b = append(b, o.code, byte(len(o.value)))
		b = append(b, o.value...)
	}
	b = append(b, optParamList, 5, optSubnetMask, optRouter, optDNS, optLeaseTime, optRenewalTime)
	b = append(b, optEnd)
	for len(b) < 300 { // some servers drop BOOTP messages shorter than 300 bytes
		b = append(b, 0)
	}
	return b
}

func parseDHCP(b []byte) (dhcpPacket, error) {
	if len(b) < 240 || !bytes.Equal(b[236:240], dhcpMagic) {
		return dhcpPacket{}, errors.New("not a DHCP message")
	}
	p := dhcpPacket{Op: b[0], XID: binary.BigEndian.Uint32(b[4:]), YIAddr: net.IP(append([]byte(nil), b[16:20]...)),
		CHAddr: net.HardwareAddr(append([]byte(nil), b[28:28+int(minByte(b[2], 16))]...)), Options: map[byte][]byte{}}
	for i := 240; i < len(b); {
		code := b[i]
		if code == optEnd {
			break
		}
		if code == 0 { // pad
			i++
			continue
		}
		if i+1 >= len(b) || i+2+int(b[i+1]) > len(b) {
			return p, errors.New("truncated DHCP option")
		}
		p.Options[code] = append(p.Options[code], b[i+2:i+2+int(b[i+1])]...)
		i += 2 + int(b[i+1])
	}
	return p, nil
}

func minByte(a, b byte) byte {
	if a < b {
		return a
	}
	return b
}

// leaseFrom reads the lease an ACK carries.
func leaseFrom(p dhcpPacket) Lease {
	l := Lease{IP: p.YIAddr, Mask: net.CIDRMask(24, 32), Lease: time.Hour}
	if v := p.Options[optSubnetMask]; len(v) == 4 {
		l.Mask = net.IPMask(v)
	}
	if v := p.Options[optRouter]; len(v) >= 4 {
		l.Router = net.IP(v[:4])
	}
	for v := p.Options[optDNS]; len(v) >= 4; v = v[4:] {
		l.DNS = append(l.DNS, net.IP(v[:4]))
	}
	if v := p.Options[optServerID]; len(v) == 4 {
		l.ServerID = net.IP(v)
	}
	if v := p.Options[optLeaseTime]; len(v) == 4 {
		l.Lease = time.Duration(binary.BigEndian.Uint32(v)) * time.Second
	}
	l.Renew = l.Lease / 2
	if v := p.Options[optRenewalTime]; len(v) == 4 {
		l.Renew = time.Duration(binary.BigEndian.Uint32(v)) * time.Second
	}
	if l.Renew < 10*time.Second {
		l.Renew = 10 * time.Second
	}
	return l
}

// Transport sends to the servers and receives their replies (a UDP socket bound to
// the interface on the machine; an in-memory server in tests).
type Transport interface {
	Send([]byte) error
	Receive(deadline time.Time) ([]byte, error)
}

// Exchange runs DISCOVER/OFFER/REQUEST/ACK, resending with backoff until the deadline.
func Exchange(t Transport, mac net.HardwareAddr, xid uint32, deadline time.Time) (Lease, error) {
	wait := time.Second
	for time.Now().Before(deadline) {
		if err := t.Send(buildDHCP(dhcpDiscover, xid, mac, nil)); err != nil {
			return Lease{}, err
		}
		offer, err := awaitDHCP(t, xid, mac, dhcpOffer, earliest(time.Now().Add(wait), deadline))
		if err != nil {
			wait = nextWait(wait)
			continue
		}
		req := buildDHCP(dhcpRequest, xid, mac, []dhcpOption{
			{optRequestedIP, offer.YIAddr.To4()},
			{optServerID, offer.Options[optServerID]},
		})
		if err := t.Send(req); err != nil {
			return Lease{}, err
		}
		ack, err := awaitDHCP(t, xid, mac, dhcpAck, earliest(time.Now().Add(wait), deadline))
		if err != nil {
			if err == errNak { // start over, but not in a tight loop
				time.Sleep(time.Until(earliest(time.Now().Add(wait), deadline)))
			}
			wait = nextWait(wait)
			continue
		}
		return leaseFrom(ack), nil
	}
	return Lease{}, fmt.Errorf("no DHCP lease")
}

func nextWait(d time.Duration) time.Duration {
	if d < 8*time.Second {
		return d * 2
	}
	return d
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// awaitDHCP waits for a reply of the wanted type to our transaction; a NAK is an error.
func awaitDHCP(t Transport, xid uint32, mac net.HardwareAddr, want byte, deadline time.Time) (dhcpPacket, error) {
	for {
		data, err := t.Receive(deadline)
		if err != nil {
			return dhcpPacket{}, err
		}
		p, err := parseDHCP(data)
		if err != nil || p.Op != 2 || p.XID != xid || !bytes.Equal(p.CHAddr, mac) {
			continue // someone else's conversation
		}
		switch p.msgType() {
		case want:
			return p, nil
		case dhcpNak:
			return dhcpPacket{}, errNak
		}
	}
}

// udpTransport is a UDP socket on port 68 bound to one interface, broadcasting to port 67.
type udpTransport struct{ conn net.PacketConn }

func NewUDPTransport(ifname string) (*udpTransport, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, syscall.IPPROTO_UDP)
	if err != nil {
		return nil, err
	}
	setup := func() error {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
			return err
		}
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_BROADCAST, 1); err != nil {
			return err
		}
		if err := syscall.BindToDevice(fd, ifname); err != nil {
			return err
		}
		return syscall.Bind(fd, &syscall.SockaddrInet4{Port: 68})
	}
	if err := setup(); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("DHCP socket on %s: %v", ifname, err)
	}
	f := os.NewFile(uintptr(fd), "dhcp-"+ifname)
	defer f.Close()
	conn, err := net.FilePacketConn(f)
	if err != nil {
		return nil, err
	}
	return &udpTransport{conn: conn}, nil
}

func (u *udpTransport) Send(b []byte) error {
	_, err := u.conn.WriteTo(b, &net.UDPAddr{IP: net.IPv4bcast, Port: 67})
	return err
}

func (u *udpTransport) Receive(deadline time.Time) ([]byte, error) {
	_ = u.conn.SetReadDeadline(deadline)
	buf := make([]byte, 1500)
	n, _, err := u.conn.ReadFrom(buf)
	return buf[:n], err
}

func (u *udpTransport) Close() { u.conn.Close() }
