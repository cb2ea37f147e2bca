package dhcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/testkit"
)

// sentMsg is a message the client sent, as the fake network saw it.
type sentMsg struct {
	at  time.Duration // since the test began
	dst net.IP        // nil: broadcast
	p   packet
}

func (s sentMsg) String() string {
	kind := map[byte]string{msgDiscover: "DISCOVER", msgRequest: "REQUEST"}[s.p.msgType()]
	to := "broadcast"
	if s.dst != nil {
		to = s.dst.String()
	}
	return fmt.Sprintf("%s %s to %s", s.at, kind, to)
}

// fakeNet is the client's network and clock in tests: it records what the client sends,
// lets answer script the replies, and when nothing is left to deliver moves time to the
// deadline, so hours of lease pass at once. It ends the run after horizon.
type fakeNet struct {
	t       *testing.T
	start   time.Time
	now     time.Time
	horizon time.Duration
	cancel  context.CancelFunc
	sent    []sentMsg
	replies testkit.Replies
	opens   int
	// answer returns the replies to a message (nil: silence).
	answer func(s sentMsg) [][]byte
	events []string
	bounds []Lease
}

func newFakeNet(t *testing.T, answer func(s sentMsg) [][]byte) *fakeNet {
	return &fakeNet{t: t, start: epoch, now: epoch, horizon: 48 * time.Hour, answer: answer}
}

func (f *fakeNet) Now() time.Time { return f.now }

func (f *fakeNet) Sleep(_ context.Context, d time.Duration) { f.advance(d) }

func (f *fakeNet) advance(d time.Duration) {
	if d > 0 {
		f.now = f.now.Add(d)
	}
	if f.now.Sub(f.start) > f.horizon {
		f.cancel()
	}
}

func (f *fakeNet) Send(b []byte, dst net.IP) error {
	p, err := parsePacket(b)
	if err != nil {
		f.t.Fatalf("the client sent garbage: %v", err)
	}
	s := sentMsg{at: f.now.Sub(f.start), dst: dst, p: p}
	f.sent = append(f.sent, s)
	f.replies.Add(f.answer(s)...)
	return nil
}

func (f *fakeNet) Receive(deadline time.Time) ([]byte, error) {
	return f.replies.Receive(deadline, func(t time.Time) { f.advance(t.Sub(f.now)) })
}

func (f *fakeNet) Close() error { return nil }

// run runs a client until stop says so (checked at each event) or the horizon passes.
func (f *fakeNet) run(stop func(f *fakeNet) bool) {
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	check := func() {
		if stop(f) {
			cancel()
		}
	}
	record := func(e string) {
		if ctx.Err() == nil {
			f.events = append(f.events, e)
		}
	}
	c := &Client{
		MAC:   testMAC,
		Open:  func() (Transport, error) { f.opens++; return f, nil },
		Clock: f,
		Rand:  rand.New(rand.NewSource(1)),
		Hooks: Hooks{
			State: func(s State) { record(s.String()); check() },
			Bound: func(l Lease, renewed bool) {
				f.bounds = append(f.bounds, l)
				record(fmt.Sprintf("BOUND %s renewed=%v at %s", l.IP, renewed, f.now.Sub(f.start)))
				check()
			},
			Lost: func(l Lease, why string) {
				record(fmt.Sprintf("LOST %s: %s at %s", l.IP, why, f.now.Sub(f.start)))
				check()
			},
		},
	}
	c.Run(ctx)
}

func (f *fakeNet) count(prefix string) int {
	n := 0
	for _, e := range f.events {
		if strings.HasPrefix(e, prefix) {
			n++
		}
	}
	return n
}

// server answers like a plain server: OFFER to DISCOVER, ACK to REQUEST, 1000 s leases.
func server(ip net.IP, extra ...[]byte) func(s sentMsg) [][]byte {
	return func(s sentMsg) [][]byte {
		opts := append([][]byte{opt(optServerID, testServer...), opt(optLeaseTime, u32(1000)...), opt(optSubnetMask, 255, 255, 255, 0)}, extra...)
		switch s.p.msgType() {
		case msgDiscover:
			return [][]byte{serverReply(msgOffer, s.p.xid, s.p.chaddr, ip, opts...)}
		case msgRequest:
			return [][]byte{serverReply(msgAck, s.p.xid, s.p.chaddr, ip, opts...)}
		}
		return nil
	}
}

func isRenewal(s sentMsg) bool { return s.p.msgType() == msgRequest && !s.p.ciaddr.IsUnspecified() }

func TestClientRenewsAtT1(t *testing.T) {
	f := newFakeNet(t, server(testIP))
	f.run(func(f *fakeNet) bool { return f.count("BOUND") == 3 })
	want := "init requesting BOUND 10.128.0.5 renewed=false at 0s bound renewing BOUND 10.128.0.5 renewed=true at 8m20s " +
		"bound renewing BOUND 10.128.0.5 renewed=true at 16m40s"
	if got := strings.Join(f.events, " "); got != want {
		t.Fatalf("events:\n%s\nwant:\n%s", got, want)
	}
	if len(f.sent) != 4 {
		t.Fatalf("sent %v", f.sent)
	}
	d, r := f.sent[0], f.sent[1]
	if d.p.msgType() != msgDiscover || d.dst != nil || d.p.flags != flagBcast || r.p.msgType() != msgRequest || r.dst != nil ||
		!bytes.Equal(r.p.options[optRequestedIP], testIP) || !bytes.Equal(r.p.options[optServerID], testServer) || d.p.xid != r.p.xid {
		t.Fatalf("selecting: %v %v", d, r)
	}
	renew := f.sent[2]
	if !isRenewal(renew) || !renew.dst.Equal(testServer) || renew.p.flags != 0 || renew.at != 500*time.Second ||
		renew.p.options[optRequestedIP] != nil || renew.p.options[optServerID] != nil || !renew.p.ciaddr.Equal(testIP) {
		t.Fatalf("renewal: %v %+v", renew, renew.p)
	}
	if f.opens != 3 {
		t.Errorf("%d sockets: want one per exchange", f.opens)
	}
}

func TestClientRebindsAtT2(t *testing.T) {
	plain := server(testIP)
	f := newFakeNet(t, func(s sentMsg) [][]byte {
		if s.dst != nil {
			return nil // the lease's server is gone
		}
		return plain(s)
	})
	f.run(func(f *fakeNet) bool { return f.count("BOUND") == 2 })
	var renewals []string
	for _, s := range f.sent[2:] {
		if !isRenewal(s) {
			t.Fatalf("not a renewal: %v", s)
		}
		renewals = append(renewals, s.String())
	}
	// T1 at 500 s; then after half the time left to T2 (875 s), at least 60 s; at T2 broadcast
	if len(renewals) != 5 || renewals[0] != "8m20s REQUEST to 10.128.0.1" ||
		!strings.Contains(renewals[3], "REQUEST to 10.128.0.1") || renewals[4] != "14m35s REQUEST to broadcast" {
		t.Fatalf("renewals: %q", renewals)
	}
	for i, want := range []time.Duration{687500, 781250, 841250} {
		want *= time.Millisecond
		if at := f.sent[3+i].at; at < want-3*time.Second || at > want+3*time.Second {
			t.Errorf("renewal %d at %s: want about %s", i+2, at, want)
		}
	}
	if got := strings.Join(f.events[4:], " "); got != "renewing rebinding BOUND 10.128.0.5 renewed=true at 14m35s" {
		t.Errorf("events %s", got)
	}
}

func TestClientLeaseExpires(t *testing.T) {
	plain := server(testIP)
	acks := 0
	f := newFakeNet(t, func(s sentMsg) [][]byte {
		if isRenewal(s) {
			return nil // nobody renews
		}
		if s.p.msgType() == msgRequest {
			acks++
		}
		return plain(s)
	})
	f.run(func(f *fakeNet) bool { return f.count("BOUND") == 2 })
	if acks != 2 || f.count("LOST 10.128.0.5: expired at 16m40s") != 1 {
		t.Fatalf("events %q", f.events)
	}
	var after []string
	for _, s := range f.sent {
		if s.at >= 1000*time.Second {
			after = append(after, s.String())
		}
	}
	if len(after) != 2 || !strings.Contains(after[0], "DISCOVER to broadcast") {
		t.Fatalf("after expiry: %q: want DISCOVER, REQUEST", after)
	}
	// rebinding retransmits: at 875 s, then the floor of 60 s, then at most until expiry
	var rebinds []time.Duration
	for _, s := range f.sent {
		if isRenewal(s) && s.dst == nil {
			rebinds = append(rebinds, s.at)
		}
	}
	if len(rebinds) != 3 || rebinds[0] != 875*time.Second || rebinds[1] < 936*time.Second || rebinds[1] > 939*time.Second {
		t.Errorf("rebinding at %v", rebinds)
	}
}

func TestClientNakWhileRenewing(t *testing.T) {
	plain := server(testIP)
	f := newFakeNet(t, func(s sentMsg) [][]byte {
		if isRenewal(s) {
			return [][]byte{serverReply(msgNak, s.p.xid, s.p.chaddr, net.IPv4zero, opt(optServerID, testServer...))}
		}
		return plain(s)
	})
	f.run(func(f *fakeNet) bool { return f.count("BOUND") == 2 })
	if f.count("LOST 10.128.0.5: refused by the server (NAK) at 8m20s") != 1 {
		t.Fatalf("events %q", f.events)
	}
	if s := f.sent[3]; s.p.msgType() != msgDiscover || s.at < 500*time.Second {
		t.Fatalf("after the NAK: %v", s)
	}
}

func TestClientRenewalChangesAddress(t *testing.T) {
	other := net.IPv4(10, 128, 0, 9).To4()
	plain, moved := server(testIP), server(other, opt(optMTU, 0x05, 0xb4))
	f := newFakeNet(t, func(s sentMsg) [][]byte {
		if isRenewal(s) {
			return moved(s)
		}
		return plain(s)
	})
	f.run(func(f *fakeNet) bool { return f.count("BOUND") == 2 })
	if got := f.events[len(f.events)-1]; got != "BOUND 10.128.0.9 renewed=true at 8m20s" || f.bounds[1].MTU != 1460 {
		t.Fatalf("events %q", f.events)
	}
}

func TestClientNakWhileRequesting(t *testing.T) {
	plain := server(testIP)
	naks := 0
	f := newFakeNet(t, func(s sentMsg) [][]byte {
		if s.p.msgType() == msgRequest && naks == 0 {
			naks++
			return [][]byte{
				serverReply(msgNak, s.p.xid, s.p.chaddr, net.IPv4zero, opt(optServerID, 10, 0, 0, 99)), // another server: ignored
				serverReply(msgNak, s.p.xid, s.p.chaddr, net.IPv4zero, opt(optServerID, testServer...)),
			}
		}
		return plain(s)
	})
	f.run(func(f *fakeNet) bool { return f.count("BOUND") == 1 })
	got := strings.Join(f.events, " ")
	if !strings.HasPrefix(got, "init requesting init requesting BOUND 10.128.0.5 renewed=false at ") {
		t.Fatalf("events %s", got)
	}
	if again := f.sent[2].at; f.sent[2].p.msgType() != msgDiscover || again < 750*time.Millisecond || again > 1250*time.Millisecond {
		t.Errorf("after the NAK: %v; want a DISCOVER after 1 s ±0.25 s", f.sent[2])
	}
}

func TestClientIgnoresOtherConversations(t *testing.T) {
	plain := server(testIP)
	f := newFakeNet(t, func(s sentMsg) [][]byte {
		other := append(net.HardwareAddr(nil), s.p.chaddr...)
		other[5]++
		noise := [][]byte{
			serverReply(msgAck, s.p.xid+1, s.p.chaddr, net.IPv4(10, 0, 0, 66)), // another transaction
			serverReply(msgAck, s.p.xid, other, net.IPv4(10, 0, 0, 66)),        // another machine
			serverReply(msgAck, s.p.xid, s.p.chaddr, net.IPv4zero),             // no address
			serverReply(msgOffer, s.p.xid, s.p.chaddr, net.IPv4(10, 0, 0, 66)), // an offer without a server id
			[]byte("garbage"), // not DHCP
			request{msgType: msgRequest, xid: s.p.xid, mac: s.p.chaddr}.marshal(), // a request, not a reply
		}
		return append(noise, plain(s)...)
	})
	f.run(func(f *fakeNet) bool { return f.count("BOUND") == 1 })
	if got := strings.Join(f.events, " "); got != "init requesting BOUND 10.128.0.5 renewed=false at 0s" {
		t.Fatalf("events %s", got)
	}
}

func TestClientRetransmitsWithBackoff(t *testing.T) {
	f := newFakeNet(t, func(sentMsg) [][]byte { return nil })
	f.horizon = 5 * time.Minute
	f.run(func(*fakeNet) bool { return false })
	var gaps []time.Duration
	for i := 1; i < len(f.sent) && f.sent[i].at < selectFor; i++ {
		gaps = append(gaps, f.sent[i].at-f.sent[i-1].at)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32}
	if len(gaps) < len(want) {
		t.Fatalf("gaps %v", gaps)
	}
	spread := false
	for i, w := range want {
		w *= time.Second
		j := w / 4
		if j > time.Second {
			j = time.Second
		}
		if gaps[i] < w-j || gaps[i] > w+j {
			t.Errorf("retransmission %d after %s: want %s ±%s", i+1, gaps[i], w, j)
		}
		spread = spread || gaps[i] != w
	}
	if !spread {
		t.Error("no jitter")
	}
	if f.opens < 2 {
		t.Errorf("one socket for %s of silence: a new one is due after %s", f.horizon, selectFor)
	}
	for _, e := range f.events {
		if e != "init" {
			t.Fatalf("events %q", f.events)
		}
	}
}

func TestClientSurvivesBrokenTransport(t *testing.T) {
	f := newFakeNet(t, nil)
	f.horizon = 10 * time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	opens := 0
	c := &Client{MAC: testMAC, Clock: f, Rand: rand.New(rand.NewSource(1)),
		Open: func() (Transport, error) { opens++; f.advance(0); return nil, errors.New("no such device") }}
	c.Run(ctx)
	if opens < 5 || opens > 20 {
		t.Fatalf("%d attempts in %s: want a few, backing off", opens, f.horizon)
	}
}

func TestStateNames(t *testing.T) {
	if Rebinding.String() != "rebinding" || State(42).String() != "unknown" || State(-1).String() != "unknown" {
		t.Fatal(Rebinding.String())
	}
}

func TestBackoff(t *testing.T) {
	b := &backoff{next: firstRetransmit, rng: rand.New(rand.NewSource(2))}
	for i, want := range []time.Duration{1, 2, 4, 8, 16, 32, 64, 64, 64} {
		want *= time.Second
		j := want / 4
		if j > time.Second {
			j = time.Second
		}
		if got := b.wait(); got < want-j || got > want+j {
			t.Errorf("wait %d: %s, want %s ±%s", i, got, want, j)
		}
	}
}
