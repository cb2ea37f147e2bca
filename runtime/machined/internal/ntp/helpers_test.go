package ntp

import (
	"net"
	"sync"
	"testing"
	"time"
)

// fakeClock is a system clock that is skew away from real time, with a ClockSetter that
// moves the skew (a slew completes at once), so a Syncer can correct it and measure the
// result without the host's clock changing. Waits up to auto fire at once; longer ones
// are handed to the test on waits, to be checked and fired.
type fakeClock struct {
	auto  time.Duration
	waits chan fakeWait

	mu     sync.Mutex
	skew   time.Duration
	steps  []time.Duration
	slews  []time.Duration
	setErr error
}

type fakeWait struct {
	d  time.Duration
	ch chan time.Time
}

func (w fakeWait) fire() { w.ch <- time.Now() }

func newFakeClock(skew time.Duration) *fakeClock {
	return &fakeClock{auto: 100 * time.Millisecond, waits: make(chan fakeWait, 16), skew: skew}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().Add(f.skew)
}

func (f *fakeClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	if d <= f.auto {
		ch <- time.Now()
		return ch
	}
	f.waits <- fakeWait{d, ch}
	return ch
}

func (f *fakeClock) Step(off time.Duration) error { return f.correct(&f.steps, off) }

func (f *fakeClock) Slew(off time.Duration) error { return f.correct(&f.slews, off) }

// correct moves the clock by off, noting it in log (steps or slews), unless setErr fails it.
func (f *fakeClock) correct(log *[]time.Duration, off time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.setErr != nil {
		return f.setErr
	}
	*log = append(*log, off)
	f.skew += off
	return nil
}

// advance moves the fake clock on, as if d had passed.
func (f *fakeClock) advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.skew += d
}

func (f *fakeClock) calls() (steps, slews []time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.steps...), append([]time.Duration(nil), f.slews...)
}

// nextWait returns the Syncer's next long wait, failing the test if none comes soon.
func (f *fakeClock) nextWait(t *testing.T) fakeWait {
	t.Helper()
	select {
	case w := <-f.waits:
		return w
	case <-time.After(5 * time.Second):
		t.Fatal("the syncer did not wait for its next poll")
		return fakeWait{}
	}
}

// fakeServer is an NTP server on 127.0.0.1 whose answers come from handle: any number of
// datagrams per request (none drops it).
type fakeServer struct {
	addr string
	mu   sync.Mutex
	n    int // requests seen
}

func (s *fakeServer) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func startFakeServer(t *testing.T, handle func(req packet) [][]byte) *fakeServer {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeServer{addr: conn.LocalAddr().String()}
	done := make(chan struct{})
	t.Cleanup(func() { conn.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			req, err := parsePacket(buf[:n])
			if err != nil {
				continue
			}
			s.mu.Lock()
			s.n++
			s.mu.Unlock()
			for _, b := range handle(req) {
				_, _ = conn.WriteToUDP(b, from)
			}
		}
	}()
	return s
}

// reply is a good server answer to req from a clock offset from real time.
func reply(req packet, offset time.Duration, stratum uint8) packet {
	now := toNTPTime(time.Now().Add(offset))
	return packet{
		version: 4, mode: modeServer, stratum: stratum, poll: 6, precision: -20,
		rootDelay: 1 << 10, rootDispersion: 1 << 10, refID: [4]byte{'G', 'P', 'S', 0},
		refTime: now, origin: req.transmit, receive: now, transmit: now,
	}
}

// goodServer answers every request from a clock offset from real time.
func goodServer(t *testing.T, offset time.Duration) *fakeServer {
	return startFakeServer(t, func(req packet) [][]byte {
		p := reply(req, offset, 2)
		return [][]byte{p.marshal()}
	})
}

// deadAddr is a UDP address where nothing listens, so queries fail at once
// (connection refused) instead of timing out.
func deadAddr(t *testing.T) string {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	addr := conn.LocalAddr().String()
	conn.Close()
	return addr
}
