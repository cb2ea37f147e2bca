package ntp

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestServerAddr(t *testing.T) {
	for in, want := range map[string]string{
		"pool.ntp.org":       "pool.ntp.org:123",
		" time.example:1123": "time.example:1123",
		"192.0.2.1":          "192.0.2.1:123",
		"2001:db8::1":        "[2001:db8::1]:123",
		"[2001:db8::1]":      "[2001:db8::1]:123",
		"[2001:db8::1]:4123": "[2001:db8::1]:4123",
		"host:":              "host:123",
	} {
		if got := serverAddr(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

func TestQueryGoodServer(t *testing.T) {
	srv := goodServer(t, 3*time.Second)
	began := time.Now()
	s, err := query(context.Background(), srv.addr, time.Now, time.Second)
	took := time.Since(began)
	if err != nil {
		t.Fatal(err)
	}
	// the round trip is at most the query's own time, and the offset is off by at most half of
	// it (however late a loaded machine schedules either side)
	if s.Delay < 0 || s.Delay > took || abs(s.Offset-3*time.Second) > took/2+time.Millisecond ||
		s.Stratum != 2 || s.Server != srv.addr {
		t.Fatalf("%+v (the query took %v)", s, took)
	}
}

// TestQuerySkipsSpoofs: garbage, a short packet and an answer to someone else's request
// arrive before the real reply; only the real one counts.
func TestQuerySkipsSpoofs(t *testing.T) {
	srv := startFakeServer(t, func(req packet) [][]byte {
		spoof := reply(req, time.Hour, 1)
		spoof.origin ^= 1
		good := reply(req, 0, 3)
		return [][]byte{[]byte("garbage"), make([]byte, 47), spoof.marshal(), good.marshal()}
	})
	s, err := query(context.Background(), srv.addr, time.Now, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if s.Stratum != 3 || abs(s.Offset) > 50*time.Millisecond {
		t.Fatalf("took a spoof: %+v", s)
	}
}

func TestQueryRejectsMismatchedOrigin(t *testing.T) {
	srv := startFakeServer(t, func(req packet) [][]byte {
		p := reply(req, 0, 2)
		p.origin = toNTPTime(time.Now()) // a server that echoes the wrong thing
		return [][]byte{p.marshal()}
	})
	_, err := query(context.Background(), srv.addr, time.Now, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "originate timestamp mismatch") {
		t.Fatalf("got %v", err)
	}
}

func TestQueryGarbageOnly(t *testing.T) {
	srv := startFakeServer(t, func(req packet) [][]byte { return [][]byte{{1, 2, 3}} })
	_, err := query(context.Background(), srv.addr, time.Now, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "short NTP packet") {
		t.Fatalf("got %v", err)
	}
}

func TestQueryKissOfDeath(t *testing.T) {
	srv := startFakeServer(t, func(req packet) [][]byte {
		p := reply(req, 0, 0)
		p.leap = leapUnsync
		copy(p.refID[:], "DENY")
		return [][]byte{p.marshal()}
	})
	_, err := query(context.Background(), srv.addr, time.Now, time.Second)
	var k *KissOfDeath
	if !errors.As(err, &k) || !k.Denied() {
		t.Fatalf("got %v", err)
	}
}

func TestQueryNoReply(t *testing.T) {
	srv := startFakeServer(t, func(req packet) [][]byte { return nil })
	start := time.Now()
	_, err := query(context.Background(), srv.addr, time.Now, 150*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no reply") {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("the timeout was not kept")
	}
	// Cancelling the context ends the wait too.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start = time.Now()
	if _, err := query(ctx, srv.addr, time.Now, 10*time.Second); err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("cancel: %v after %v", err, time.Since(start))
	}
}
