package dhcp

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"net"
	"time"
)

const (
	// firstRetransmit starts RFC 2131 §4.1's schedule at 1 s rather than 4 s: a cloud's
	// server answers at once, and a lost first packet should not cost four seconds.
	firstRetransmit = time.Second
	maxRetransmit   = 64 * time.Second
	// selectFor bounds one DISCOVER conversation; the next one gets a fresh socket.
	selectFor = 2 * time.Minute
	// requestFor is about four REQUESTs (1+2+4+8 s) before going back to DISCOVER.
	requestFor = 16 * time.Second
	// minRenewRetransmit is RFC 2131 §4.4.5's floor between REQUESTs when renewing or rebinding.
	minRenewRetransmit = 60 * time.Second
)

var (
	errNak      = errors.New("the DHCP server refused the request (NAK)")
	errNoAnswer = errors.New("no answer from a DHCP server")
)

// State is where the client is in RFC 2131's state diagram (§4.4).
type State int

const (
	Init       State = iota // no lease: discovering servers
	Requesting              // requesting an offered address
	Bound                   // holding a lease until T1
	Renewing                // T1 to T2: asking the lease's server, unicast
	Rebinding               // T2 to expiry: asking any server, broadcast
)

var stateNames = [...]string{Init: "init", Requesting: "requesting", Bound: "bound", Renewing: "renewing", Rebinding: "rebinding"}

func (s State) String() string {
	if s < 0 || int(s) >= len(stateNames) {
		return "unknown"
	}
	return stateNames[s]
}

// Clock is the client's time; tests advance a fake one instead of waiting for leases to run out.
type Clock interface {
	Now() time.Time
	// Sleep waits for d, or less when ctx ends.
	Sleep(ctx context.Context, d time.Duration)
}

// SystemClock is real time.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Hooks tell the client's owner what changed (see HooksFor).
type Hooks = HooksFor[State, Lease]

// Client gets and keeps the lease of one interface.
type Client struct {
	MAC net.HardwareAddr
	// Open (required) gives a transport for one exchange. No socket is held while bound, so hours of
	// other machines' broadcasts do not queue up in front of the next answer.
	Open  func() (Transport, error)
	Clock Clock      // nil: SystemClock
	Rand  *rand.Rand // transaction ids and jitter; nil: seeded from the time
	Hooks Hooks

	clk Clock
	rng *rand.Rand
}

// Run gets a lease and keeps it until ctx ends. A real socket's wait does not watch ctx, so
// Run may return only after the current wait; machined never stops it.
func (c *Client) Run(ctx context.Context) {
	c.clk, c.rng = c.Clock, c.Rand
	if c.clk == nil {
		c.clk = SystemClock()
	}
	if c.rng == nil {
		c.rng = NewRand(c.MAC)
	}
	c.Hooks.Cycle(ctx, c.acquire, c.hold)
}

// acquire runs DISCOVER exchanges until one gives a lease; false when ctx ended. After a NAK
// or a broken socket it waits before the next, so as not to loop tightly.
func (c *Client) acquire(ctx context.Context) (Lease, bool) {
	retry := c.backoff()
	return c.Hooks.Acquire(ctx, c.clk, Init, c.discover, func(error) time.Duration { return retry.wait() })
}

// discover runs DISCOVER, OFFER, REQUEST, ACK.
func (c *Client) discover(ctx context.Context) (Lease, error) {
	t, err := c.Open()
	if err != nil {
		return Lease{}, err
	}
	defer t.Close()
	x := c.exchange(t)
	offer, _, err := x.ask(ctx, request{msgType: msgDiscover}, nil, c.clk.Now().Add(selectFor), c.backoff().wait, isOffer)
	if err != nil {
		return Lease{}, err
	}
	c.Hooks.Enter(Requesting)
	server := offer.serverID()
	req := request{msgType: msgRequest, options: []option{{optRequestedIP, offer.yiaddr.To4()}, {optServerID, server}}}
	reply, sent, err := x.ask(ctx, req, nil, c.clk.Now().Add(requestFor), c.backoff().wait, answerFrom(server))
	if err != nil {
		return Lease{}, err
	}
	return leaseOf(reply, sent, server)
}

// hold keeps a lease: BOUND until T1, then extend. It returns the last lease and why it
// was lost, or no reason when ctx ended.
func (c *Client) hold(ctx context.Context, l Lease) (Lease, string) {
	renewAt := func(l Lease) time.Time { return l.Start.Add(l.Renew) }
	return c.Hooks.Hold(ctx, c.clk, Bound, l, renewAt, c.extend, func(err error) string {
		if errors.Is(err, errNak) {
			return "refused by the server (NAK)"
		}
		return "expired"
	})
}

// extend asks the lease's server (RENEWING, until T2), then any server (REBINDING, until
// the lease expires).
func (c *Client) extend(ctx context.Context, l Lease) (Lease, error) {
	c.Hooks.Enter(Renewing)
	next, err := c.renew(ctx, l, l.ServerID, l.Start.Add(l.Rebind))
	if err == nil || errors.Is(err, errNak) || ctx.Err() != nil {
		return next, err
	}
	c.Hooks.Enter(Rebinding)
	return c.renew(ctx, l, nil, l.Expiry())
}

// renew sends REQUESTs carrying our address in ciaddr and neither a requested address nor
// a server id (RFC 2131 table 5), to server (nil: broadcast), until an answer or until.
func (c *Client) renew(ctx context.Context, l Lease, server net.IP, until time.Time) (Lease, error) {
	t, ok := OpenBy(ctx, c.clk, until, c.Open)
	if !ok {
		return Lease{}, errNoAnswer
	}
	defer t.Close()
	wait := func() time.Duration { return c.renewWait(until) }
	req := request{msgType: msgRequest, ciaddr: l.IP}
	reply, sent, err := c.exchange(t).ask(ctx, req, server, until, wait, answerFrom(nil))
	if err != nil {
		return Lease{}, err
	}
	return leaseOf(reply, sent, l.ServerID)
}

// renewWait is RFC 2131 §4.4.5's delay: half the time left, at least 60 s (ask stops at until).
func (c *Client) renewWait(until time.Time) time.Duration {
	d := until.Sub(c.clk.Now()) / 2
	if d < minRenewRetransmit {
		d = minRenewRetransmit
	}
	return jitter(d, c.rng)
}

// isOffer accepts an OFFER we could request: a usable address and a server id.
func isOffer(p packet) bool {
	return p.msgType() == msgOffer && usableAddress(p.yiaddr.To4()) && p.serverID() != nil
}

// answerFrom accepts an ACK with a usable address, or a NAK. Given a server, only its NAK
// counts: the other servers see our broadcast REQUEST too.
func answerFrom(server net.IP) func(packet) bool {
	return func(p packet) bool {
		switch p.msgType() {
		case msgAck:
			return usableAddress(p.yiaddr.To4())
		case msgNak:
			id := p.serverID()
			return server == nil || id == nil || id.Equal(server)
		}
		return false
	}
}

// leaseOf turns an ACK into a lease (keeping server as its server id when it names none),
// and a NAK into errNak.
func leaseOf(p packet, sent time.Time, server net.IP) (Lease, error) {
	if p.msgType() == msgNak {
		return Lease{}, errNak
	}
	l, err := leaseFrom(p, sent)
	if err != nil {
		return Lease{}, err
	}
	if l.ServerID == nil {
		l.ServerID = server
	}
	return l, nil
}

// exchange is one transaction: one transaction id, and the replies that carry it.
type exchange struct {
	c   *Client
	t   Transport
	xid uint32
}

func (c *Client) exchange(t Transport) *exchange { return &exchange{c: c, t: t, xid: c.rng.Uint32()} }

// ask sends m to dst (nil: broadcast), and again after each wait, until accept takes a
// reply to this transaction or the deadline passes. It returns the reply and when m was
// first sent, which is when a lease starts.
func (x *exchange) ask(ctx context.Context, m request, dst net.IP, deadline time.Time, wait func() time.Duration,
	accept func(packet) bool) (packet, time.Time, error) {
	m.xid, m.mac = x.xid, x.c.MAC
	msg := m.marshal()
	r := Retransmit[packet]{
		Clock:   x.c.clk,
		Send:    func(time.Time) error { return x.t.Send(msg, dst) },
		Receive: x.t.Receive,
		Take: func(data []byte) (packet, bool) {
			p, err := parsePacket(data)
			return p, err == nil && x.ours(p) && accept(p)
		},
	}
	p, first, ok := r.Ask(ctx, deadline, wait)
	if !ok {
		return packet{}, first, errNoAnswer
	}
	return p, first, nil
}

// ours says whether p answers this transaction.
func (x *exchange) ours(p packet) bool {
	mac := x.c.MAC
	if len(mac) > 16 {
		mac = mac[:16]
	}
	return p.op == opReply && p.xid == x.xid && bytes.Equal(p.chaddr, mac)
}

// backoff is the retransmission schedule: doubling from firstRetransmit up to 64 s.
type backoff struct {
	next time.Duration
	rng  *rand.Rand
}

func (c *Client) backoff() *backoff { return &backoff{next: firstRetransmit, rng: c.rng} }

func (b *backoff) wait() time.Duration {
	d := b.next
	if b.next *= 2; b.next > maxRetransmit {
		b.next = maxRetransmit
	}
	return jitter(d, b.rng)
}

// jitter moves d by up to ±1 s (RFC 2131 §4.1), a quarter of d when that is less, so
// machines booted together do not all send in step.
func jitter(d time.Duration, rng *rand.Rand) time.Duration {
	j := d / 4
	if j > time.Second {
		j = time.Second
	}
	if j <= 0 {
		return d
	}
	return d - j + time.Duration(rng.Int63n(int64(2*j)+1))
}
