package dhcp

import (
	"context"
	"time"
)

// Retransmit is how this package's client and internal/dhcp6's ask a server: send, read
// replies until the next send is due, send again, until an answer or a deadline. M is the
// reply type (a DHCPv4 packet, a DHCPv6 message).
type Retransmit[M any] struct {
	Clock Clock
	// Send sends the request once; first is when it was first sent (DHCPv6's elapsed time).
	// Its error is a lost packet: the next send comes after the wait all the same.
	Send func(first time.Time) error
	// Receive returns the next datagram, or an error once until has passed.
	Receive func(until time.Time) ([]byte, error)
	// Take parses a datagram and says whether it is the answer asked for.
	Take func(data []byte) (M, bool)
}

// Ask sends, and again after each wait, until Take takes a reply (ok) or the deadline passes
// or ctx ends. It returns the reply and when the request was first sent, which is when a
// lease starts.
func (r Retransmit[M]) Ask(ctx context.Context, deadline time.Time, wait func() time.Duration) (reply M, first time.Time, ok bool) {
	first = r.Clock.Now()
	for ctx.Err() == nil && r.Clock.Now().Before(deadline) {
		_ = r.Send(first) // a failed send is a lost packet: wait, then send again
		next := r.Clock.Now().Add(wait())
		if next.After(deadline) {
			next = deadline
		}
		if reply, ok = r.await(ctx, next); ok {
			return reply, first, true
		}
	}
	return reply, first, false
}

// await reads replies until Take takes one or until comes.
func (r Retransmit[M]) await(ctx context.Context, until time.Time) (M, bool) {
	var none M
	for ctx.Err() == nil && r.Clock.Now().Before(until) {
		data, err := r.Receive(until)
		if err != nil {
			r.Clock.Sleep(ctx, until.Sub(r.Clock.Now())) // a broken socket fails at once: do not spin
			return none, false
		}
		if m, ok := r.Take(data); ok {
			return m, true
		}
	}
	return none, false
}
