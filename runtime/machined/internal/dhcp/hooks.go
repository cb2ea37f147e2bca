package dhcp

import (
	"context"
	"hash/fnv"
	"math/rand"
	"net"
	"time"
)

// HooksFor tell a client's owner what changed, for a client whose states are S and whose
// leases are L: this package's client and internal/dhcp6's. They run on the client's
// goroutine, so a lease is applied before the client moves on; a nil hook is skipped.
type HooksFor[S, L any] struct {
	// State reports each state entered, for status.
	State func(S)
	// Bound gets each lease acquired (renewed false) or extended (renewed true). An extended
	// lease may carry another address or other routes, which then replace the old ones.
	Bound func(l L, renewed bool)
	// Lost says the lease expired or a server refused or ended it: what Bound applied must go.
	Lost func(l L, reason string)
}

// Enter reports the state s entered.
func (h HooksFor[S, L]) Enter(s S) {
	if h.State != nil {
		h.State(s)
	}
}

// Extended reports l, the lease a renewal gave.
func (h HooksFor[S, L]) Extended(l L) { h.bound(l, true) }

func (h HooksFor[S, L]) bound(l L, renewed bool) {
	if h.Bound != nil {
		h.Bound(l, renewed)
	}
}

// Cycle is a client's life until ctx ends: acquire a lease (false when ctx ended), report it
// bound, hold it until it is lost (hold gives the last lease and why; no reason when ctx
// ended), report the loss, and start over.
func (h HooksFor[S, L]) Cycle(ctx context.Context, acquire func(context.Context) (L, bool),
	hold func(context.Context, L) (L, string)) {
	for {
		l, ok := acquire(ctx)
		if !ok {
			return
		}
		h.bound(l, false)
		l, reason := hold(ctx, l)
		if reason == "" {
			return
		}
		if h.Lost != nil {
			h.Lost(l, reason)
		}
	}
}

// Acquire runs attempt, in state init, until it gives a lease; false when ctx ended. After a
// failed attempt it sleeps what rest says for that error (0: try again at once).
func (h HooksFor[S, L]) Acquire(ctx context.Context, clk Clock, init S, attempt func(context.Context) (L, error),
	rest func(error) time.Duration) (L, bool) {
	for {
		h.Enter(init)
		l, err := attempt(ctx)
		if ctx.Err() != nil {
			var none L
			return none, false
		}
		if err == nil {
			return l, true
		}
		clk.Sleep(ctx, rest(err))
	}
}

// Hold keeps lease l: in state bound until renewAt(l), then extend it, again and again. It
// returns the last lease and why it was lost (lostBecause names extend's error), or no reason
// when ctx ended.
func (h HooksFor[S, L]) Hold(ctx context.Context, clk Clock, bound S, l L, renewAt func(L) time.Time,
	extend func(context.Context, L) (L, error), lostBecause func(error) string) (L, string) {
	for {
		h.Enter(bound)
		clk.Sleep(ctx, renewAt(l).Sub(clk.Now()))
		if ctx.Err() != nil {
			return l, ""
		}
		next, err := extend(ctx, l)
		switch {
		case ctx.Err() != nil:
			return l, ""
		case err != nil:
			return l, lostBecause(err)
		}
		h.Extended(next)
		l = next
	}
}

// OpenBy gives open's transport for an exchange that must end by until, and false when until
// has passed or open failed; after a failure it first waits until then, so that a renewal
// does not loop on a broken socket.
func OpenBy[T any](ctx context.Context, clk Clock, until time.Time, open func() (T, error)) (T, bool) {
	var none T
	if !clk.Now().Before(until) {
		return none, false
	}
	t, err := open()
	if err != nil {
		clk.Sleep(ctx, until.Sub(clk.Now()))
		return none, false
	}
	return t, true
}

// NewRand seeds a client's randomness from the time with the MAC mixed in, so that identical
// VMs booted in the same instant (with the same clock) still pick different transaction ids
// and jitter.
func NewRand(mac net.HardwareAddr) *rand.Rand {
	h := fnv.New64a()
	h.Write(mac)
	return rand.New(rand.NewSource(time.Now().UnixNano() ^ int64(h.Sum64())))
}
