package ntp

import "time"

// Clock is where the Syncer reads the time and waits, so the polling logic can be tested
// without real waiting and against a clock that fake steps and slews actually move.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// systemClock is the real clock.
type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
