package dhcp6

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"net"
	"time"

	"kiln/machined/internal/dhcp"
)

// Retransmission parameters (RFC 8415 §7.6). SOL_MAX_RT is 3600 s there; machined asks every
// two minutes at most, so that a server set up after the boot is found soon.
const (
	solTimeout = time.Second
	solMaxRT   = 2 * time.Minute
	reqTimeout = time.Second
	reqMaxRT   = 30 * time.Second
	renTimeout = 10 * time.Second
	renMaxRT   = 600 * time.Second
	// solicitFor bounds one SOLICIT conversation; the next gets a fresh socket.
	solicitFor = 5 * time.Minute
	// requestFor is about REQ_MAX_RC's ten REQUESTs before going back to SOLICIT.
	requestFor = 90 * time.Second
)

var errNoAnswer = errors.New("no answer from a DHCPv6 server")

// State is internal/dhcp's: the same five states, named alike (Requesting follows an ADVERTISE
// here, an OFFER there; Rebinding runs to the end of the valid lifetime).
type State = dhcp.State

const (
	Init       = dhcp.Init
	Requesting = dhcp.Requesting
	Bound      = dhcp.Bound
	Renewing   = dhcp.Renewing
	Rebinding  = dhcp.Rebinding
)

// Clock is internal/dhcp's: real time on the machine, a fake one in tests.
type Clock = dhcp.Clock

// Hooks tell the client's owner what changed (see internal/dhcp's HooksFor).
type Hooks = dhcp.HooksFor[State, Lease]

// Client gets and keeps one IA_NA address for one interface.
type Client struct {
	MAC net.HardwareAddr
	// Open (required) gives a transport for one exchange; no socket is held while bound.
	Open  func() (Transport, error)
	Clock Clock      // nil: real time
	Rand  *rand.Rand // transaction ids and jitter; nil: seeded from the time and MAC
	Hooks Hooks

	clk  Clock
	rng  *rand.Rand
	duid []byte
	iaid uint32
}

// Run gets a lease and keeps it until ctx ends.
func (c *Client) Run(ctx context.Context) {
	c.clk, c.rng = c.Clock, c.Rand
	if c.clk == nil {
		c.clk = dhcp.SystemClock()
	}
	if c.rng == nil {
		c.rng = dhcp.NewRand(c.MAC)
	}
	c.duid, c.iaid = duidLL(c.MAC), iaid(c.MAC)
	c.Hooks.Cycle(ctx, c.acquire, c.hold)
}

// acquire runs SOLICIT conversations until one gives a lease; false when ctx ended. After a
// refusal or no socket it waits before the next, so as not to loop tightly.
func (c *Client) acquire(ctx context.Context) (Lease, bool) {
	retry := c.backoff(solTimeout, solMaxRT)
	return c.Hooks.Acquire(ctx, c.clk, Init, c.solicit, func(err error) time.Duration {
		if err == errNoAnswer {
			return 0
		}
		return retry.wait()
	})
}

// solicit runs SOLICIT, ADVERTISE, REQUEST, REPLY. The first ADVERTISE with an address is
// taken rather than collecting them for a second: clouds run one server.
func (c *Client) solicit(ctx context.Context) (Lease, error) {
	t, err := c.Open()
	if err != nil {
		return Lease{}, err
	}
	defer t.Close()
	adv, _, err := c.ask(ctx, t, msgSolicit, []option{iaNA(c.iaid, nil)}, c.clk.Now().Add(solicitFor),
		c.backoff(solTimeout, solMaxRT), c.answer(msgAdvertise, nil, false))
	if err != nil {
		return Lease{}, err
	}
	offered, err := leaseFrom(adv, c.iaid, c.clk.Now())
	if err != nil {
		return Lease{}, err
	}
	c.Hooks.Enter(Requesting)
	server := offered.ServerID
	opts := []option{{optServerID, server}, iaNA(c.iaid, offered.IP)}
	reply, sent, err := c.ask(ctx, t, msgRequest, opts, c.clk.Now().Add(requestFor), c.backoff(reqTimeout, reqMaxRT),
		c.answer(msgReply, server, true))
	if err != nil {
		return Lease{}, err
	}
	return leaseFrom(reply, c.iaid, sent)
}

// hold keeps a lease: BOUND until T1, then extend. It returns the last lease and why it
// was lost, or no reason when ctx ended.
func (c *Client) hold(ctx context.Context, l Lease) (Lease, string) {
	renewAt := func(l Lease) time.Time { return l.Start.Add(l.T1) }
	return c.Hooks.Hold(ctx, c.clk, Bound, l, renewAt, c.extend, func(err error) string {
		var refused statusError
		if errors.As(err, &refused) {
			return "ended by the server: " + refused.Error()
		}
		return "expired"
	})
}

// extend sends RENEW to the lease's server until T2, then REBIND to any server until the
// address's valid lifetime ends.
func (c *Client) extend(ctx context.Context, l Lease) (Lease, error) {
	c.Hooks.Enter(Renewing)
	next, err := c.renew(ctx, l, msgRenew, l.Start.Add(l.T2))
	if err != errNoAnswer || ctx.Err() != nil {
		return next, err
	}
	c.Hooks.Enter(Rebinding)
	return c.renew(ctx, l, msgRebind, l.Expiry())
}

// renew sends RENEW (naming the server) or REBIND (naming none) for the lease's address
// until an answer or until.
func (c *Client) renew(ctx context.Context, l Lease, msgType byte, until time.Time) (Lease, error) {
	t, ok := dhcp.OpenBy(ctx, c.clk, until, c.Open)
	if !ok {
		return Lease{}, errNoAnswer
	}
	defer t.Close()
	opts := []option{iaNA(c.iaid, l.IP)}
	var server []byte
	if msgType == msgRenew {
		server = l.ServerID
		opts = append([]option{{optServerID, server}}, opts...)
	}
	reply, sent, err := c.ask(ctx, t, msgType, opts, until, c.backoff(renTimeout, renMaxRT), c.answer(msgReply, server, true))
	if err != nil {
		return Lease{}, err
	}
	return leaseFrom(reply, c.iaid, sent)
}

// answer accepts a message of msgType for us (our client id), from server when one is
// given, that gives an address or, when refusals count, ends the binding. Other answers
// (UnspecFail, UseMulticast) are ignored and the client asks again.
func (c *Client) answer(msgType byte, server []byte, refusals bool) func(message) bool {
	return func(m message) bool {
		if m.msgType != msgType || !bytes.Equal(m.get(optClientID), c.duid) {
			return false
		}
		if server != nil && !bytes.Equal(m.get(optServerID), server) {
			return false
		}
		_, err := leaseFrom(m, c.iaid, time.Time{})
		var se statusError
		return err == nil || refusals && errors.As(err, &se) && se.refusal()
	}
}

// ask sends a message of msgType with opts (plus the client id, the option request and
// the elapsed time), and again after each wait, until accept takes a reply with the
// transaction id or the deadline passes. It returns the reply and when it first sent.
func (c *Client) ask(ctx context.Context, t Transport, msgType byte, opts []option, deadline time.Time, b *backoff,
	accept func(message) bool) (message, time.Time, error) {
	xid := c.rng.Uint32() & 0xffffff
	r := dhcp.Retransmit[message]{
		Clock: c.clk,
		Send: func(first time.Time) error {
			m := message{msgType: msgType, xid: xid, options: append([]option{{optClientID, c.duid}}, opts...)}
			m.options = append(m.options, oro(), elapsed(int64(c.clk.Now().Sub(first))))
			return t.Send(m.marshal())
		},
		Receive: t.Receive,
		Take: func(data []byte) (message, bool) {
			m, err := parseMessage(data)
			return m, err == nil && m.xid == xid && accept(m)
		},
	}
	reply, first, ok := r.Ask(ctx, deadline, b.wait)
	if !ok {
		return message{}, first, errNoAnswer
	}
	return reply, first, nil
}

// backoff is RFC 8415 §15's schedule: RT starts at IRT and doubles up to MRT, each time
// moved by up to a tenth either way.
type backoff struct {
	rt, mrt time.Duration
	first   bool
	rng     *rand.Rand
}

func (c *Client) backoff(irt, mrt time.Duration) *backoff {
	return &backoff{rt: irt, mrt: mrt, first: true, rng: c.rng}
}

func (b *backoff) wait() time.Duration {
	if !b.first {
		b.rt *= 2
	}
	b.first = false
	if b.rt > b.mrt {
		b.rt = b.mrt
	}
	tenth := int64(b.rt / 10)
	if tenth <= 0 {
		return b.rt
	}
	return b.rt - time.Duration(tenth) + time.Duration(b.rng.Int63n(2*tenth+1))
}
