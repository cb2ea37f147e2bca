package ntp

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	at := func(addr string, off, delay time.Duration) Sample {
		return Sample{Server: addr, Addr: addr, Offset: off, Delay: delay}
	}
	hour := time.Hour
	cases := []struct {
		name  string
		first bool
		c     time.Duration
		bests []Sample
		want  correction
	}{
		{"small: slewed", false, ms(100), []Sample{at("a", ms(100), 0)}, doSlew},
		{"first sync, one server: stepped", true, hour, []Sample{at("a", hour, 0)}, doStep},
		{"later, one server, an hour: refused", false, hour, []Sample{at("a", hour, 0)}, doRefuse},
		{"later, one server, within MaxSlew: slewed", false, ms(900), []Sample{at("a", ms(900), 0)}, doSlew},
		{"later, two that agree: stepped", false, hour, []Sample{at("a", hour, 0), at("b", hour+ms(100), 0)}, doStep},
		{"later, agreement within half the delay", false, hour, []Sample{at("a", hour, 0), at("b", hour+ms(200), ms(200))}, doStep},
		{"later, two that disagree: refused", false, hour, []Sample{at("a", hour, 0), at("b", 2*hour, 0)}, doRefuse},
		{"later, two names for one address: refused", false, hour, []Sample{at("a", hour, 0), {Server: "b", Addr: "a", Offset: hour}}, doRefuse},
		{"later, backwards by a day, one server: refused", false, -24 * hour, []Sample{at("a", -24*hour, 0)}, doRefuse},
	}
	for _, c := range cases {
		got, why := decide(c.first, Sample{Offset: c.c}, c.bests)
		if got != c.want || (got == doRefuse) != (why != "") {
			t.Errorf("%s: %v %q", c.name, got, why)
		}
	}
	_, why := decide(false, Sample{Offset: hour}, []Sample{at("a", hour, 0)})
	if !strings.Contains(why, "only one answered") || !strings.Contains(why, "1h0m0s") {
		t.Errorf("the refusal says %q", why)
	}
}

// movableServer answers from a clock offset from real time by what offset holds now.
func movableServer(t *testing.T, offset *atomic.Int64) *fakeServer {
	return startFakeServer(t, func(req packet) [][]byte {
		p := reply(req, time.Duration(offset.Load()), 2)
		return [][]byte{p.marshal()}
	})
}

// TestRunRefusesALaterStepOnOneServersWord: once synced, a server (say, DHCP's) that jumps an
// hour is refused, said once, the clock untouched; a second server that agrees lets the step
// through.
func TestRunRefusesALaterStepOnOneServersWord(t *testing.T) {
	var offset atomic.Int64
	one := movableServer(t, &offset)
	var mu sync.Mutex
	var said []string
	say := func(format string, args ...interface{}) {
		mu.Lock()
		said = append(said, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	refusals := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, line := range said {
			if strings.Contains(line, "refusing to step") {
				n++
			}
		}
		return n
	}
	s, f := startSyncerSaying(t, 0, []string{one.addr}, say)
	waitSynced(t, s)
	offset.Store(int64(time.Hour))
	expectWait(t, f, minPoll).fire()
	expectWait(t, f, minPoll).fire() // refused: asked again soon
	expectWait(t, f, minPoll)
	if steps, _ := f.calls(); len(steps) != 0 {
		t.Fatalf("stepped %v on one server's word", steps)
	}
	if st := s.Status(); !st.Synced || !strings.Contains(st.Error, "refusing to step the clock by 1h0m0s") {
		t.Fatalf("status %+v", st)
	}
	if n := refusals(); n != 1 {
		t.Fatalf("the refusal was said %d times, want once: %q", n, said)
	}

	var other atomic.Int64
	other.Store(int64(time.Hour + 20*time.Millisecond))
	two := movableServer(t, &other)
	s.SetServers([]string{one.addr, two.addr})
	expectWait(t, f, minPoll)
	if steps, _ := f.calls(); len(steps) != 1 || abs(steps[0]-time.Hour) > 100*time.Millisecond {
		t.Fatalf("two servers agree on an hour, steps %v", steps)
	}
	if st := s.Status(); st.Error != "" {
		t.Fatalf("status after the step %+v", st)
	}
}
