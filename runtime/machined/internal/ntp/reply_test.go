package ntp

import (
	"strings"
	"testing"
	"time"
)

func TestOffsetDelay(t *testing.T) {
	base := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	// Local clock 500 ms behind; 20 ms each way; the server takes 2 ms.
	// t1=0 (local) -> t2 = 0+20+500 = 520 (server) ; t3 = 522 ; t4 = 522-500+20 = 42 (local).
	off, delay := offsetDelay(at(0), at(520), at(522), at(42))
	if off != 500*time.Millisecond || delay != 40*time.Millisecond {
		t.Fatalf("offset %v delay %v", off, delay)
	}
	// Asymmetric path: 30 ms out, 10 ms back; the error is half the asymmetry.
	off, delay = offsetDelay(at(0), at(30-200), at(31-200), at(41))
	if off != -200*time.Millisecond+10*time.Millisecond || delay != 40*time.Millisecond {
		t.Fatalf("offset %v delay %v", off, delay)
	}
}

func TestNewSample(t *testing.T) {
	t1 := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	t4 := t1.Add(10 * time.Millisecond)
	p := goodPacket(1)
	p.receive = toNTPTime(t1.Add(time.Hour + 5*time.Millisecond))
	p.transmit = p.receive
	p.rootDelay = 1 << 15 // 0.5 s
	s, err := newSample("x", p, t1, t4)
	if err != nil {
		t.Fatal(err)
	}
	if s.Offset != time.Hour || s.Delay != 10*time.Millisecond || s.Stratum != 2 || s.RootDelay != 500*time.Millisecond || s.Server != "x" {
		t.Fatalf("%+v", s)
	}

	// The 2036 rollover falls between the client's and the server's timestamps.
	t1 = time.Date(2036, 2, 7, 6, 28, 15, 0, time.UTC)
	p.receive = toNTPTime(t1.Add(3 * time.Second))
	p.transmit = p.receive
	if p.receive>>32 != 2 {
		t.Fatalf("receive %#x is not in era 1", uint64(p.receive))
	}
	s, err = newSample("x", p, t1, t1)
	if err != nil || s.Offset != 3*time.Second {
		t.Fatalf("across 2036: %+v %v", s, err)
	}

	bad := map[string]func(p *packet){
		"delay":    func(p *packet) { p.receive = toNTPTime(t1.Add(-2 * time.Second)); p.transmit = toNTPTime(t1) }, // server "took" 2 s
		"transmit": func(p *packet) { p.receive = toNTPTime(t1.Add(time.Second)); p.transmit = toNTPTime(t1) },
	}
	for want, mutate := range bad {
		q := p
		mutate(&q)
		if _, err := newSample("x", q, t1, t1.Add(10*time.Millisecond)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
	if _, err := newSample("x", goodPacket(1), t1, t1.Add(3*time.Second)); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Errorf("slow round trip: %v", err)
	}
}
