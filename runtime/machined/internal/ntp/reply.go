package ntp

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

const (
	// maxDelay bounds the round trip of a usable sample: the offset's error is up to half
	// the delay, and a longer trip means a congested or distant path, not a better clock.
	maxDelay = time.Second
	// maxRootDistance bounds the server's own error estimate (root delay / 2 + root
	// dispersion); chrony refuses sources beyond 3 s by default, we are a little stricter.
	maxRootDistance = 1500 * time.Millisecond
	// delaySlack tolerates a slightly negative delay (server and client clocks tick at
	// slightly different rates); anything more negative is nonsense and refused, so a
	// hostile server cannot claim the lowest delay.
	delaySlack = time.Millisecond
)

// errOriginMismatch marks a packet that does not answer our request: spoofed, delayed
// from an earlier query, or unrelated. The query keeps waiting for the real reply.
var errOriginMismatch = errors.New("reply does not match our request (originate timestamp mismatch)")

// KissOfDeath is a server's refusal: a stratum-0 reply whose reference ID is an ASCII
// code (RFC 5905 section 7.4).
type KissOfDeath struct{ Code string }

func (k *KissOfDeath) Error() string { return fmt.Sprintf("kiss-o'-death %q from server", k.Code) }

// Denied reports DENY or RSTR: the server refuses us for good, so stop asking it.
func (k *KissOfDeath) Denied() bool { return k.Code == "DENY" || k.Code == "RSTR" }

// RateLimited reports RATE: we asked too often and must back off.
func (k *KissOfDeath) RateLimited() bool { return k.Code == "RATE" }

// kissCode renders a reference ID as printable ASCII whatever the server sent.
func kissCode(id [4]byte) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return -1
		}
		return r
	}, string(id[:]))
}

// checkReply accepts p only as a synchronised server's answer to the request whose
// transmit timestamp was sent.
func checkReply(p packet, sent ntpTime) error {
	if p.origin != sent {
		return errOriginMismatch
	}
	if p.mode != modeServer {
		return fmt.Errorf("not a server reply (mode %d)", p.mode)
	}
	if p.version < 3 || p.version > 4 {
		return fmt.Errorf("unsupported NTP version %d", p.version)
	}
	if p.stratum == 0 {
		return &KissOfDeath{Code: kissCode(p.refID)}
	}
	if p.leap == leapUnsync {
		return errors.New("server is not synchronised (leap indicator 3)")
	}
	if p.stratum > maxStratum {
		return fmt.Errorf("server is not synchronised (stratum %d)", p.stratum)
	}
	if p.transmit == 0 || p.receive == 0 {
		return errors.New("server sent a zero timestamp")
	}
	if d := shortDuration(p.rootDelay)/2 + shortDuration(p.rootDispersion); d > maxRootDistance {
		return fmt.Errorf("server's root distance %v is too large", d)
	}
	return nil
}

// Sample is one measurement of the local clock against a server.
type Sample struct {
	Server         string
	Addr           string        // the address that answered (ip:port), telling apart two names for one server
	Offset         time.Duration // add to the local clock to agree with the server
	Delay          time.Duration // round trip, less the server's processing time
	Stratum        int
	RootDelay      time.Duration
	RootDispersion time.Duration
	At             time.Time // local time the reply arrived
}

// offsetDelay is RFC 5905's on-wire calculation: t1 request sent (local clock), t2 request
// received and t3 reply sent (server clock), t4 reply received (local clock). Halves are
// added rather than the sum halved so absurd clocks cannot overflow.
func offsetDelay(t1, t2, t3, t4 time.Time) (offset, delay time.Duration) {
	offset = t2.Sub(t1)/2 + t3.Sub(t4)/2
	delay = t4.Sub(t1) - t3.Sub(t2)
	return offset, delay
}

// newSample measures the clock from a reply that passed checkReply. The server's
// timestamps are placed in the era nearest the local send time.
func newSample(server string, p packet, t1, t4 time.Time) (Sample, error) {
	t2, t3 := p.receive.time(t1), p.transmit.time(t1)
	if t3.Before(t2) {
		return Sample{}, errors.New("server's transmit time is before its receive time")
	}
	offset, delay := offsetDelay(t1, t2, t3, t4)
	if delay < -delaySlack {
		return Sample{}, fmt.Errorf("negative round-trip delay %v", delay)
	}
	if delay < 0 {
		delay = 0
	}
	if delay > maxDelay {
		return Sample{}, fmt.Errorf("round-trip delay %v is too long", delay)
	}
	return Sample{
		Server:         server,
		Offset:         offset,
		Delay:          delay,
		Stratum:        int(p.stratum),
		RootDelay:      shortDuration(p.rootDelay),
		RootDispersion: shortDuration(p.rootDispersion),
		At:             t4,
	}, nil
}
