package ntp

import "sort"

// best returns the sample with the lowest delay: queueing on the path only ever adds
// delay and skews the offset by up to half of it, so the quickest exchange is the most
// trustworthy (RFC 5905's clock filter chooses the same way).
func best(samples []Sample) (Sample, bool) {
	if len(samples) == 0 {
		return Sample{}, false
	}
	b := samples[0]
	for _, s := range samples[1:] {
		if s.Delay < b.Delay {
			b = s
		}
	}
	return b, true
}

// combine merges the servers' best samples into one: the median offset, so one wrong
// server among three or more cannot move the clock. With an even count the offset is the
// mean of the two middle ones, reported as the lower-delay one of those two.
func combine(bests []Sample) (Sample, bool) {
	n := len(bests)
	if n == 0 {
		return Sample{}, false
	}
	s := append([]Sample(nil), bests...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].Offset < s[j].Offset })
	if n%2 == 1 {
		return s[n/2], true
	}
	a, b := s[n/2-1], s[n/2]
	r := a
	if b.Delay < a.Delay {
		r = b
	}
	r.Offset = a.Offset/2 + b.Offset/2
	return r, true
}
