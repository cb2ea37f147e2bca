package ntp

import (
	"testing"
	"time"
)

func TestTimestampRoundTrip(t *testing.T) {
	for _, s := range []string{"2024-05-01T12:00:00.123456789Z", "2035-12-31T23:59:59.5Z", "2036-02-07T06:28:16Z", "2050-01-01T00:00:00.000001Z"} {
		want, _ := time.Parse(time.RFC3339Nano, s)
		got := toNTPTime(want).time(want)
		if d := abs(got.Sub(want)); d > time.Nanosecond {
			t.Errorf("%s: round trip gave %s", s, got.Format(time.RFC3339Nano))
		}
	}
}

func TestTimestampKnownValues(t *testing.T) {
	// 2024-01-01T00:00:00Z is 3913056000 s after 1900.
	ts := toNTPTime(time.Date(2024, 1, 1, 0, 0, 0, 5e8, time.UTC))
	if ts>>32 != 3913056000 || ts&0xffffffff != 1<<31 {
		t.Fatalf("got %#x", uint64(ts))
	}
}

// TestEra2036 places timestamps on both sides of the first NTP era rollover
// (2036-02-07T06:28:16Z, when the 32-bit seconds wrap to 0).
func TestEra2036(t *testing.T) {
	rollover := time.Date(2036, 2, 7, 6, 28, 16, 0, time.UTC)
	cases := []struct {
		pivot time.Time
		secs  uint32
		want  time.Time
	}{
		{rollover.Add(-10 * time.Second), 5, rollover.Add(5 * time.Second)},                                        // client before, server after
		{rollover.Add(10 * time.Second), 0xffffffff, rollover.Add(-time.Second)},                                   // client after, server before
		{rollover.Add(10 * time.Second), 20, rollover.Add(20 * time.Second)},                                       // both after
		{rollover.Add(-10 * time.Second), 0xfffffff0, rollover.Add(-16 * time.Second)},                             // both before
		{time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), 0, rollover},                                                 // six years ahead
		{time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), 100, rollover.Add(100 * time.Second)},                        // 64 years on: still era 1
		{time.Date(2170, 1, 1, 0, 0, 0, 0, time.UTC), 100, rollover.Add(eraSeconds*time.Second + 100*time.Second)}, // near the 2172 rollover: era 2
	}
	for _, c := range cases {
		got := ntpTime(uint64(c.secs) << 32).time(c.pivot)
		if !got.Equal(c.want) {
			t.Errorf("secs %#x near %s: got %s, want %s", c.secs, c.pivot, got, c.want)
		}
	}
}

// TestEraFloor: a local clock reset to 1970 still reads a server's time after 2038 right.
func TestEraFloor(t *testing.T) {
	want := time.Date(2060, 6, 1, 0, 0, 0, 0, time.UTC)
	got := toNTPTime(want).time(time.Unix(0, 0))
	if !got.Equal(want) {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestShortDuration(t *testing.T) {
	if got := shortDuration(3<<16 | 1<<15); got != 3500*time.Millisecond {
		t.Fatalf("got %v", got)
	}
}
