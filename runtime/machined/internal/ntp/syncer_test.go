package ntp

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/testkit"
)

// startSyncer runs a Syncer on a fake clock skew away from real time until the test ends.
func startSyncer(t *testing.T, skew time.Duration, servers []string) (*Syncer, *fakeClock) {
	t.Helper()
	return startSyncerSaying(t, skew, servers, t.Logf)
}

func startSyncerSaying(t *testing.T, skew time.Duration, servers []string, say func(string, ...interface{})) (*Syncer, *fakeClock) {
	t.Helper()
	f := newFakeClock(skew)
	s := New(servers, say)
	s.Clock, s.Setter = f, f
	// a query's wait for a reply: long, so that a loaded machine's late scheduling of the fake
	// servers is not a lost answer (a dead server's port answers at once with ICMP unreachable)
	s.timeout = 5 * time.Second
	s.gap = 10 * time.Millisecond
	testkit.RunUntilStopped(t, 5*time.Second, s.Run)
	return s, f
}

func waitSynced(t *testing.T, s *Syncer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !s.WaitSynced(ctx) {
		t.Fatalf("not synced: %+v", s.Status())
	}
}

func expectWait(t *testing.T, f *fakeClock, want time.Duration) fakeWait {
	t.Helper()
	w := f.nextWait(t)
	if w.d != want {
		t.Fatalf("waiting %v, want %v", w.d, want)
	}
	return w
}

// TestRunBadAndGoodServer: an unsynchronised server claiming the time is an hour earlier
// loses to a good one 5 s ahead; the clock is stepped, then slewed, and the poll interval
// grows from 64 s.
func TestRunBadAndGoodServer(t *testing.T) {
	bad := startFakeServer(t, func(req packet) [][]byte {
		p := reply(req, -time.Hour, 1)
		p.leap = leapUnsync
		return [][]byte{p.marshal()}
	})
	good := goodServer(t, 5*time.Second)
	s, f := startSyncer(t, 0, []string{bad.addr, good.addr})
	waitSynced(t, s)

	st := s.Status()
	if !st.Synced || st.Server != good.addr || st.Stratum != 2 || st.Error != "" ||
		abs(time.Duration(st.OffsetMS*1e6)-5*time.Second) > 50*time.Millisecond ||
		!reflect.DeepEqual(st.Servers, []string{bad.addr, good.addr}) {
		t.Fatalf("status %+v", st)
	}
	if _, err := time.Parse(time.RFC3339, st.LastSync); err != nil {
		t.Fatalf("last_sync %q: %v", st.LastSync, err)
	}
	if steps, slews := f.calls(); len(steps) != 1 || abs(steps[0]-5*time.Second) > 50*time.Millisecond || len(slews) != 0 {
		t.Fatalf("steps %v slews %v", steps, slews)
	}

	expectWait(t, f, minPoll).fire()
	interval := expectNextInterval(t, s, f, minPoll) // in sync now: slewed, interval doubled
	interval.fire()
	// a sample's offset is off by at most half its delay, which a loaded machine makes large
	bound := 50*time.Millisecond + time.Duration(s.Status().DelayMS*1e6)/2
	if steps, slews := f.calls(); len(steps) != 1 || len(slews) != 1 || abs(slews[0]) > bound {
		t.Fatalf("steps %v slews %v (bound %v)", steps, slews, bound)
	}
	if n := good.requests(); n != 1+s.samples {
		t.Fatalf("good server asked %d times, want %d", n, 1+s.samples)
	}
	expectNextInterval(t, s, f, interval.d)
}

// expectNextInterval takes the loop's next wait and checks it is the interval nextInterval gives
// for the offset the syncer measured: doubled while the offset stays small, which it is unless
// the machine schedules the fake server late (TestNextInterval checks the rule itself).
func expectNextInterval(t *testing.T, s *Syncer, f *fakeClock, previous time.Duration) fakeWait {
	t.Helper()
	w := f.nextWait(t)
	offset := time.Duration(s.Status().OffsetMS * 1e6)
	if want := nextInterval(previous, false, offset); w.d != want {
		t.Fatalf("waiting %v after an offset of %v, want %v", w.d, offset, want)
	}
	if abs(offset) < stableOffset/2 && w.d != 2*previous { // well within: whatever the rounding
		t.Fatalf("waiting %v after an offset of %v: not doubled", w.d, offset)
	}
	return w
}

func TestNextInterval(t *testing.T) {
	for _, c := range []struct {
		interval time.Duration
		restart  bool
		offset   time.Duration
		want     time.Duration
	}{
		{0, false, 0, minPoll},                                     // none before
		{4 * minPoll, true, 0, minPoll},                            // a step or a first sync
		{minPoll, false, 5 * time.Millisecond, 2 * minPoll},        // stable: doubled
		{minPoll, false, -stableOffset + 1, 2 * minPoll},           // just within, below
		{2 * minPoll, false, stableOffset, 2 * minPoll},            // at the edge: kept
		{2 * minPoll, false, -100 * time.Millisecond, 2 * minPoll}, // slewed a lot: kept
		{maxPoll, false, 0, maxPoll},                               // never past maxPoll
	} {
		if got := nextInterval(c.interval, c.restart, c.offset); got != c.want {
			t.Errorf("nextInterval(%v, %v, %v) = %v, want %v", c.interval, c.restart, c.offset, got, c.want)
		}
	}
}

// TestRunBackoffThenNewServers: with no server answering the retries back off from 2 s;
// a new server list is polled at once.
func TestRunBackoffThenNewServers(t *testing.T) {
	s, f := startSyncer(t, 0, []string{deadAddr(t)})
	expectWait(t, f, 2*time.Second).fire()
	expectWait(t, f, 4*time.Second).fire()
	expectWait(t, f, 8*time.Second) // not fired: the new list must wake the loop
	st := s.Status()
	if st.Synced || !strings.Contains(st.Error, "no usable answer") {
		t.Fatalf("status %+v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if s.WaitSynced(ctx) {
		t.Fatal("WaitSynced before any sync")
	}

	good := goodServer(t, -time.Second)
	s.SetServers([]string{good.addr, " ", good.addr})
	waitSynced(t, s)
	if st := s.Status(); st.Server != good.addr || st.Error != "" || !reflect.DeepEqual(st.Servers, []string{good.addr}) {
		t.Fatalf("status %+v", st)
	}
	expectWait(t, f, minPoll)
}

// TestRunKissOfDeath: a DENY server is never asked again; a RATE server is left alone
// for 64 s, then twice as long.
func TestRunKissOfDeath(t *testing.T) {
	kiss := func(code string) func(packet) [][]byte {
		return func(req packet) [][]byte {
			p := reply(req, 0, 0)
			p.leap = leapUnsync
			copy(p.refID[:], code)
			return [][]byte{p.marshal()}
		}
	}
	deny := startFakeServer(t, kiss("DENY"))
	rate := startFakeServer(t, kiss("RATE"))
	s, f := startSyncer(t, 0, []string{deny.addr, rate.addr})

	expectWait(t, f, retryMin).fire()
	if st := s.Status(); !strings.Contains(st.Error, `"DENY"`) || !strings.Contains(st.Error, `"RATE"`) {
		t.Fatalf("status %+v", st)
	}
	w := f.nextWait(t) // the RATE hold, less the time the first poll took
	if w.d > minPoll || w.d < minPoll-5*time.Second {
		t.Fatalf("waiting %v for the RATE hold", w.d)
	}
	f.advance(w.d)
	w.fire()
	expectWait(t, f, 2*retryMin).fire() // RATE again
	if w := f.nextWait(t); w.d > 2*minPoll || w.d < 2*minPoll-5*time.Second {
		t.Fatalf("waiting %v for the doubled RATE hold", w.d)
	}
	if deny.requests() != 1 || rate.requests() != 2 {
		t.Fatalf("deny asked %d times, rate %d", deny.requests(), rate.requests())
	}

	// The DENY is remembered across a list change that keeps the server.
	good := goodServer(t, 0)
	s.SetServers([]string{deny.addr, good.addr})
	waitSynced(t, s)
	if deny.requests() != 1 {
		t.Fatalf("asked a server that denied us")
	}
}

// TestRunSetterFailure: a clock that cannot be set is an error, retried, not a sync.
func TestRunSetterFailure(t *testing.T) {
	good := goodServer(t, time.Minute)
	f := newFakeClock(0)
	f.setErr = errPerm
	s := New([]string{good.addr}, nil)
	s.Clock, s.Setter, s.timeout = f, f, 300*time.Millisecond
	var l loopState
	if d := s.poll(context.Background(), &l); d != retryMin {
		t.Fatalf("wait %v", d)
	}
	if st := s.Status(); st.Synced || !strings.Contains(st.Error, "setting the clock") {
		t.Fatalf("status %+v", st)
	}
}

var errPerm = permError{}

type permError struct{}

func (permError) Error() string { return "operation not permitted" }

func TestNoServers(t *testing.T) {
	s := New(nil, nil)
	s.Clock = newFakeClock(0)
	var l loopState
	if d := s.poll(context.Background(), &l); d != maxPoll {
		t.Fatalf("wait %v", d)
	}
	b, _ := json.Marshal(s.Status())
	want := `{"synced":false,"server":"","offset_ms":0,"delay_ms":0,"stratum":0,"last_sync":"","servers":[],"error":"no NTP servers configured"}`
	if string(b) != want {
		t.Fatalf("status JSON %s", b)
	}
}

func TestRetryBackoff(t *testing.T) {
	var l loopState
	var got []time.Duration
	for i := 0; i < 8; i++ {
		got = append(got, l.retry())
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second, 64 * time.Second, 64 * time.Second}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%v", got)
	}
}
