package ntp

import "time"

// ntpTime is an NTP timestamp: seconds since 1900-01-01 in the high 32 bits, the
// fraction of a second in the low 32 bits. The seconds wrap every 2^32 s (136 years),
// the first time on 2036-02-07; which era a timestamp is in is not on the wire.
type ntpTime uint64

const (
	unixToNTP  = 2208988800 // seconds from 1900-01-01 to 1970-01-01
	eraSeconds = 1 << 32
)

// pivotFloor is the earliest reference used to place a timestamp in its era. A machine
// cannot be running an image built after it, so a local clock earlier than this (an RTC
// reset to 1970, say) is wrong, and using it as the reference would misplace the server's
// time by an era once the server's time is past 2038. With the floor, server times up to
// 2092 are placed correctly whatever the local clock says.
var pivotFloor = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// toNTPTime encodes t; the era is dropped, as on the wire.
func toNTPTime(t time.Time) ntpTime {
	secs := t.Unix() + unixToNTP
	frac := (uint64(t.Nanosecond()) << 32) / 1e9
	return ntpTime(uint64(uint32(secs))<<32 | frac)
}

// time decodes ts as the instant nearest to pivot (or to pivotFloor, if pivot is earlier),
// so timestamps are read in the current era across the 2036 rollover and any later one.
func (ts ntpTime) time(pivot time.Time) time.Time {
	if pivot.Before(pivotFloor) {
		pivot = pivotFloor
	}
	p := pivot.Unix() + unixToNTP
	secs := p&^(eraSeconds-1) | int64(ts>>32)
	switch {
	case secs-p >= eraSeconds/2:
		secs -= eraSeconds
	case p-secs > eraSeconds/2:
		secs += eraSeconds
	}
	ns := (uint64(ts&0xffffffff)*1e9 + 1<<31) >> 32
	return time.Unix(secs-unixToNTP, int64(ns)).UTC()
}

// shortDuration decodes NTP's 16.16 fixed-point "short" format (root delay, root dispersion).
func shortDuration(v uint32) time.Duration {
	return time.Duration(uint64(v) * uint64(time.Second) >> 16)
}
