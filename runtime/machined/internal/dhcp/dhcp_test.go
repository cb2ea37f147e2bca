package dhcp

import (
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"
)

// fakeDHCPServer answers like QEMU's user network: OFFER then ACK, broadcast.
type fakeDHCPServer struct {
	replies chan []byte
	nak     bool
	noise   bool // also send a reply to another client first
	seen    []byte
	silent  bool // never answers
}

func (s *fakeDHCPServer) Send(b []byte) error {
	p, err := parseDHCP(b)
	if err != nil {
		return err
	}
	s.seen = append(s.seen, p.msgType())
	if s.silent {
		return nil
	}
	reply := func(msgType byte, xid uint32, mac net.HardwareAddr) []byte {
		r := make([]byte, 240)
		r[0], r[1], r[2] = 2, 1, 6
		binary.BigEndian.PutUint32(r[4:], xid)
		copy(r[16:], net.IPv4(10, 0, 2, 15).To4())
		copy(r[28:], mac)
		copy(r[236:], dhcpMagic)
		r = append(r, optMessageType, 1, msgType, optSubnetMask, 4, 255, 255, 255, 0, optRouter, 4, 10, 0, 2, 2,
			optDNS, 8, 10, 0, 2, 3, 1, 1, 1, 1, optServerID, 4, 10, 0, 2, 2, optLeaseTime, 4, 0, 1, 0x51, 0x80, 0, 0, optEnd)
		return r
	}
	if s.noise {
		s.replies <- reply(dhcpOffer, p.XID+1, p.CHAddr)
	}
	switch p.msgType() {
	case dhcpDiscover:
		s.replies <- reply(dhcpOffer, p.XID, p.CHAddr)
	case dhcpRequest:
		if string(p.Options[optRequestedIP]) != string(net.IPv4(10, 0, 2, 15).To4()) {
			return errors.New("requested the wrong address")
		}
		if s.nak {
			s.replies <- reply(dhcpNak, p.XID, p.CHAddr)
		} else {
			s.replies <- reply(dhcpAck, p.XID, p.CHAddr)
		}
	}
	return nil
}

func (s *fakeDHCPServer) Receive(deadline time.Time) ([]byte, error) {
	select {
	case b := <-s.replies:
		return b, nil
	case <-time.After(time.Until(deadline)):
		return nil, errors.New("timeout")
	}
}

func TestDHCPExchange(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	server := &fakeDHCPServer{replies: make(chan []byte, 8), noise: true}
	lease, err := Exchange(server, mac, 0xdeadbeef, time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if lease.IPNet().String() != "10.0.2.15/24" || !lease.Router.Equal(net.IPv4(10, 0, 2, 2)) ||
		len(lease.DNS) != 2 || !lease.DNS[1].Equal(net.IPv4(1, 1, 1, 1)) || lease.Lease != 86400*time.Second || lease.Renew != 43200*time.Second {
		t.Fatalf("lease %+v", lease)
	}
	if string(server.seen) != string([]byte{dhcpDiscover, dhcpRequest}) {
		t.Fatalf("messages %v", server.seen)
	}
}

func TestDHCPNakAndTimeout(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	server := &fakeDHCPServer{replies: make(chan []byte, 8), nak: true}
	if _, err := Exchange(server, mac, 1, time.Now().Add(300*time.Millisecond)); err == nil {
		t.Fatal("a NAK must not give a lease")
	}
	silent := &fakeDHCPServer{replies: make(chan []byte), silent: true}
	began := time.Now()
	if _, err := Exchange(silent, mac, 1, time.Now().Add(200*time.Millisecond)); err == nil || time.Since(began) > 2*time.Second {
		t.Fatalf("no server: %v after %s", err, time.Since(began))
	}
}

func TestDHCPPacket(t *testing.T) {
	mac := net.HardwareAddr{1, 2, 3, 4, 5, 6}
	b := buildDHCP(dhcpRequest, 42, mac, []dhcpOption{{optRequestedIP, []byte{10, 0, 0, 9}}})
	if len(b) < 300 || b[10] != 0x80 {
		t.Fatalf("length %d, flags %x: want >= 300 bytes and the broadcast flag", len(b), b[10])
	}
	p, err := parseDHCP(b)
	if err != nil || p.XID != 42 || p.CHAddr.String() != mac.String() || p.msgType() != dhcpRequest ||
		string(p.Options[optRequestedIP]) != "\x0a\x00\x00\x09" {
		t.Fatalf("%+v %v", p, err)
	}
	if _, err := parseDHCP(b[:200]); err == nil {
		t.Fatal("short packet")
	}
	trunc := append(append([]byte(nil), b[:240]...), optDNS, 8, 1, 2)
	if _, err := parseDHCP(trunc); err == nil {
		t.Fatal("truncated option")
	}
}
