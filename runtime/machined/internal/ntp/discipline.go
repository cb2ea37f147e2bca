package ntp

import "time"

// StepThreshold is NTP's step threshold (RFC 5905's STEPT): a larger offset is stepped,
// a smaller one slewed.
const StepThreshold = 128 * time.Millisecond

// ClockSetter changes the system clock. It is an interface so tests (and anything else
// that must not touch the host's clock) can substitute their own.
type ClockSetter interface {
	// Step adds offset to the clock at once.
	Step(offset time.Duration) error
	// Slew adds offset to the clock gradually, keeping time monotonic.
	Slew(offset time.Duration) error
}

// correct applies offset to the clock: a step when it is beyond StepThreshold (a
// far-off RTC must be fixed before anything uses TLS), a slew otherwise (small errors are
// corrected without time jumping, backwards in particular).
func correct(set ClockSetter, offset time.Duration) (stepped bool, err error) {
	if offset > StepThreshold || offset < -StepThreshold {
		return true, set.Step(offset)
	}
	return false, set.Slew(offset)
}
