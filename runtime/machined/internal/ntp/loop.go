package ntp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"kiln/machined/internal/safego"
)

const (
	minPoll = 64 * time.Second   // after a step or the first sync
	maxPoll = 1024 * time.Second // once the clock has stayed put
	// stableOffset is how close the clock must be for the poll interval to grow.
	stableOffset = StepThreshold / 4
	// retryMin and retryMax bound the backoff when no server gives a usable answer:
	// quick at first (boot may be waiting), never faster than minPoll for long.
	retryMin = 2 * time.Second
	retryMax = minPoll
	// rateHoldMax caps how long a server that sent RATE is left alone.
	rateHoldMax = 4 * maxPoll
)

// Run polls until ctx ends: at once, then every 64 s growing to 1024 s while the clock
// stays within stableOffset, sooner (backing off from 2 s) while no server answers, and
// at once when SetServers changes the list. Run once per Syncer.
func (s *Syncer) Run(ctx context.Context) {
	select {
	case <-s.wake: // a list set before Run is polled first anyway
	default:
	}
	var l loopState
	for ctx.Err() == nil {
		wait := s.poll(ctx, &l)
		select {
		case <-ctx.Done():
			return
		case <-s.Clock.After(wait):
		case <-s.wake:
		}
	}
}

// loopState is what Run carries from one poll to the next.
type loopState struct {
	interval time.Duration // the current poll interval while in sync
	failures int           // polls in a row without a usable answer
	refusing bool          // the last poll refused a step (said once until it ends)
}

// retry is the wait after a failed poll.
func (l *loopState) retry() time.Duration {
	l.failures++
	d := retryMin
	for i := 1; i < l.failures && d < retryMax; i++ {
		d *= 2
	}
	if d > retryMax {
		d = retryMax
	}
	return d
}

// usable returns the configured servers and those that may be asked now, with the end
// of the earliest RATE hold (zero if none).
func (s *Syncer) usable(now time.Time) (all, active []string, hold time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	all = append([]string(nil), s.servers...)
	for _, srv := range all {
		st := s.state[srv]
		switch {
		case st == nil:
			active = append(active, srv)
		case st.denied:
		case now.Before(st.holdUntil):
			if hold.IsZero() || st.holdUntil.Before(hold) {
				hold = st.holdUntil
			}
		default:
			active = append(active, srv)
		}
	}
	return all, active, hold
}

// kissed applies a kiss-o'-death from server, if err is one, and reports whether it was.
func (s *Syncer) kissed(server string, err error) bool {
	var k *KissOfDeath
	if !errors.As(err, &k) || !(k.Denied() || k.RateLimited()) {
		return false
	}
	s.mu.Lock()
	st := s.state[server]
	if st == nil {
		st = &serverState{}
		s.state[server] = st
	}
	if k.Denied() {
		st.denied = true
	} else {
		st.rateHold *= 2
		if st.rateHold < minPoll {
			st.rateHold = minPoll
		}
		if st.rateHold > rateHoldMax {
			st.rateHold = rateHoldMax
		}
		st.holdUntil = s.Clock.Now().Add(st.rateHold)
	}
	hold := st.rateHold
	s.mu.Unlock()
	if k.Denied() {
		s.say("ntp: %s refused service (%s); no longer using it", server, k.Code)
	} else {
		s.say("ntp: %s asks us to slow down (RATE); leaving it alone for %v", server, hold)
	}
	return true
}

// answered clears a server's RATE backoff once it answers again.
func (s *Syncer) answered(server string) {
	s.mu.Lock()
	if st := s.state[server]; st != nil && !st.denied {
		st.rateHold = 0
	}
	s.mu.Unlock()
}

type result struct {
	sample Sample
	err    error
}

// queryAll asks every server once, in parallel.
func (s *Syncer) queryAll(ctx context.Context, servers []string) []result {
	res := make([]result, len(servers))
	var wg sync.WaitGroup
	for i, srv := range servers {
		i, srv := i, srv
		res[i].err = fmt.Errorf("%s: query failed", srv)
		wg.Add(1)
		safego.Go("ntp query", func() {
			defer wg.Done()
			smp, err := query(ctx, srv, s.Clock.Now, s.timeout)
			res[i] = result{smp, err}
		})
	}
	wg.Wait()
	return res
}

// sleep waits d on the Syncer's clock; false if ctx ended first.
func (s *Syncer) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-s.Clock.After(d):
		return true
	}
}

// poll measures the clock against every usable server, corrects it, and returns how long
// to wait before the next poll. Before the first sync each server is asked once, so boot
// is not held up by the spacing that keeps rate-limiting servers happy; after that, a few
// times, keeping each server's lowest-delay answer.
func (s *Syncer) poll(ctx context.Context, l *loopState) time.Duration {
	now := s.Clock.Now()
	all, active, hold := s.usable(now)
	switch {
	case len(all) == 0:
		s.fail("no NTP servers configured")
		return maxPoll
	case len(active) == 0 && hold.IsZero():
		s.fail("every NTP server refused service")
		return maxPoll
	case len(active) == 0:
		s.fail("every NTP server asked us to slow down")
		return hold.Sub(now)
	}
	rounds := 1
	if s.isSynced() && s.samples > 1 {
		rounds = s.samples
	}
	samples := map[string][]Sample{}
	errs := map[string]error{}
	for r := 0; r < rounds && len(active) > 0; r++ {
		if r > 0 && !s.sleep(ctx, s.gap) {
			return 0
		}
		var next []string
		for i, res := range s.queryAll(ctx, active) {
			srv := active[i]
			switch {
			case res.err == nil:
				samples[srv] = append(samples[srv], res.sample)
				next = append(next, srv)
			case s.kissed(srv, res.err):
				errs[srv] = res.err
			default:
				errs[srv] = res.err
				next = append(next, srv)
			}
		}
		active = next
	}
	if ctx.Err() != nil {
		return 0
	}
	var bests []Sample
	for _, srv := range all {
		if b, ok := best(samples[srv]); ok {
			bests = append(bests, b)
			s.answered(srv)
		}
	}
	c, ok := combine(bests)
	if !ok {
		s.fail("no usable answer from any NTP server: " + joinErrors(all, errs))
		return l.retry()
	}
	first := !s.isSynced()
	how, why := decide(first, c, bests)
	if how == doRefuse {
		// the clock stays as it is; asked again at the shortest interval, so a second
		// server (or the first one come to its senses) is heard soon
		s.refuse(why, !l.refusing)
		l.refusing = true
		l.interval = minPoll
		return minPoll
	}
	l.refusing = false
	stepped, err := apply(s.Setter, how, c.Offset)
	if err != nil {
		s.fail(fmt.Sprintf("setting the clock: %v", err))
		return l.retry()
	}
	s.succeed(c, stepped)
	l.failures = 0
	l.interval = nextInterval(l.interval, stepped || first, c.Offset)
	return l.interval
}

// nextInterval is the poll interval after a sync: minPoll after a step or the first sync (or
// with none before), doubled up to maxPoll while the offset stays within stableOffset, else kept.
func nextInterval(interval time.Duration, restart bool, offset time.Duration) time.Duration {
	switch {
	case restart || interval == 0:
		return minPoll
	case offset < stableOffset && offset > -stableOffset && interval < maxPoll:
		return interval * 2
	}
	return interval
}

// joinErrors lists the servers' errors in server order; each already names its server.
func joinErrors(servers []string, errs map[string]error) string {
	var parts []string
	for _, srv := range servers {
		if err := errs[srv]; err != nil {
			parts = append(parts, err.Error())
		}
	}
	if len(parts) == 0 {
		return "no answers"
	}
	return strings.Join(parts, "; ")
}
