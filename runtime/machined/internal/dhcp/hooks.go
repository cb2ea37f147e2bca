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

// NewRand seeds a client's randomness from the time with the MAC mixed in, so that identical
// VMs booted in the same instant (with the same clock) still pick different transaction ids
// and jitter.
func NewRand(mac net.HardwareAddr) *rand.Rand {
	h := fnv.New64a()
	h.Write(mac)
	return rand.New(rand.NewSource(time.Now().UnixNano() ^ int64(h.Sum64())))
}
