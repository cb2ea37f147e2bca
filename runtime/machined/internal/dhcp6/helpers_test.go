package dhcp6

import (
	"context"
	"encoding/binary"
	"net"
	"time"

	"kiln/machined/internal/testkit"
)

var (
	testMAC    = net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	testDUID   = []byte{0, 3, 0, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56}
	serverDUID = []byte{0, 1, 0, 1, 1, 2, 3, 4, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}
	testIP     = net.ParseIP("2001:db8::100")
	testDNS    = net.ParseIP("2001:db8::53")
	epoch      = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
)

func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// iaAddr is an IAADDR option with lifetimes and sub-options.
func iaAddr(ip net.IP, preferred, valid uint32, subs ...option) option {
	v := append(append(append([]byte(nil), ip.To16()...), u32(preferred)...), u32(valid)...)
	return option{optIAAddr, appendOptions(v, subs)}
}

// ia is an IA_NA option as a server sends it.
func ia(id, t1, t2 uint32, subs ...option) option {
	v := append(append(u32(id), u32(t1)...), u32(t2)...)
	return option{optIANA, appendOptions(v, subs)}
}

func statusOpt(code uint16, text string) option {
	return option{optStatusCode, append(binary.BigEndian.AppendUint16(nil, code), text...)}
}

// serverMsg is a server's ADVERTISE or REPLY to xid with the usual ids and opts.
func serverMsg(msgType byte, xid uint32, opts ...option) []byte {
	base := []option{{optClientID, testDUID}, {optServerID, serverDUID}}
	return message{msgType: msgType, xid: xid, options: append(base, opts...)}.marshal()
}

// goodLease is what dnsmasq gives: a 2-minute lease, T1 60 s, T2 105 s, a DNS server.
func goodLease(ip net.IP) []option {
	return []option{ia(iaid(testMAC), 60, 105, iaAddr(ip, 120, 120)), {optDNSServers, testDNS.To16()}}
}

// fakeClock advances only when the client sleeps or waits.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) {
	if d > 0 && ctx.Err() == nil {
		c.now = c.now.Add(d)
	}
}

// fakeServer is a transport that hands each message to answer and queues its replies;
// waiting for a reply that is not there moves the clock to the deadline.
type fakeServer struct {
	clk     *fakeClock
	answer  func(m message) [][]byte
	replies testkit.Replies
	sent    []message
	opens   int
}

func (s *fakeServer) open() (Transport, error) { s.opens++; return s, nil }

func (s *fakeServer) Send(b []byte) error {
	m, err := parseMessage(b)
	if err != nil {
		return err
	}
	s.sent = append(s.sent, m)
	s.replies.Add(s.answer(m)...)
	return nil
}

func (s *fakeServer) Receive(deadline time.Time) ([]byte, error) {
	return s.replies.Receive(deadline, func(t time.Time) {
		if t.After(s.clk.now) {
			s.clk.now = t
		}
	})
}

func (s *fakeServer) Close() error { return nil }
