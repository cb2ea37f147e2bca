package ntp

import (
	"fmt"
	"time"
)

// StepThreshold is NTP's step threshold (RFC 5905's STEPT): a larger offset is stepped,
// a smaller one slewed.
const StepThreshold = 128 * time.Millisecond

// MaxSlew bounds the correction one server's word may make after the first sync: an offset up
// to it is slewed (at the kernel's 500 ppm, a second takes about 33 minutes), a larger one is
// stepped only when two servers agree on it and refused otherwise. One server, which a DHCP
// answer can name, must not be able to move a running clock by hours (certificates' validity,
// TOTP, logs), while a real jump (a VM resumed after a pause) is fixed by any two servers.
const MaxSlew = time.Second

// ClockSetter changes the system clock. It is an interface so tests (and anything else
// that must not touch the host's clock) can substitute their own.
type ClockSetter interface {
	// Step adds offset to the clock at once.
	Step(offset time.Duration) error
	// Slew adds offset to the clock gradually, keeping time monotonic.
	Slew(offset time.Duration) error
}

// correction is what decide chooses to do with a measured offset.
type correction int

const (
	doSlew correction = iota
	doStep
	doRefuse
)

// decide chooses how to correct the clock by c.Offset, the combination of bests (each
// server's best sample):
//   - within StepThreshold: slew (small errors are corrected without time jumping);
//   - the first sync since boot: step (a far-off RTC must be fixed before anything uses TLS);
//   - after that, a step needs two servers (distinct addresses) that agree on the offset,
//     each within StepThreshold plus half its round trip of it;
//   - without them, slew up to MaxSlew, and refuse more, saying why.
func decide(first bool, c Sample, bests []Sample) (correction, string) {
	off := c.Offset
	switch {
	case abs(off) <= StepThreshold:
		return doSlew, ""
	case first:
		return doStep, ""
	case agreeing(c, bests) >= 2:
		return doStep, ""
	case abs(off) <= MaxSlew:
		return doSlew, ""
	}
	return doRefuse, fmt.Sprintf("refusing to step the clock by %v: after the first sync a step beyond %v needs "+
		"two NTP servers that agree on it, and %s", off.Round(time.Second), MaxSlew, agreement(c, bests))
}

// agreeing counts the distinct server addresses whose best sample agrees with c's offset.
func agreeing(c Sample, bests []Sample) int {
	seen := map[string]bool{}
	for _, b := range bests {
		addr := b.Addr
		if addr == "" {
			addr = b.Server
		}
		if abs(b.Offset-c.Offset) <= StepThreshold+b.Delay/2 {
			seen[addr] = true
		}
	}
	return len(seen)
}

// agreement says how many servers answered and agreed, for the refusal.
func agreement(c Sample, bests []Sample) string {
	n := agreeing(c, bests)
	switch {
	case len(bests) <= 1:
		return "only one answered (add servers to time.servers)"
	case n <= 1:
		return fmt.Sprintf("%d answered but none agrees with another", len(bests))
	}
	return fmt.Sprintf("%d of %d agree", n, len(bests))
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// apply makes the correction decide chose; stepped says whether the clock jumped.
func apply(set ClockSetter, how correction, offset time.Duration) (stepped bool, err error) {
	if how == doStep {
		return true, set.Step(offset)
	}
	return false, set.Slew(offset)
}

// correct applies offset to the clock: a step when it is beyond StepThreshold (a
// far-off RTC must be fixed before anything uses TLS), a slew otherwise (small errors are
// corrected without time jumping, backwards in particular). It is the first sync's rule;
// decide holds the rule for later ones.
func correct(set ClockSetter, offset time.Duration) (stepped bool, err error) {
	how, _ := decide(true, Sample{Offset: offset}, nil)
	return apply(set, how, offset)
}
