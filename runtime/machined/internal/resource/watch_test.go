package resource

import (
	"context"
	"testing"
	"time"
)

// Pending takes what there is without waiting: the current state right after Watch (none for a
// type with no resources), then only what changed since.
func TestPendingNeverWaits(t *testing.T) {
	s := NewState()
	_ = s.Claim("a", "o")
	_ = s.Claim("b", "o")
	_, _ = s.Put("o", "a", "x", 1)
	_, _ = s.Put("o", "b", "y", 2)
	_, _ = s.Put("o", "c", "z", 3) // not claimed: refused, nothing there
	empty := s.Watch("c", "")
	defer empty.Close()
	if evs := empty.Pending(); len(evs) != 0 {
		t.Fatalf("a type with no resources: %+v", evs)
	}
	both := s.WatchTypes([]Type{"a", "b"}, "")
	defer both.Close()
	if evs := both.Pending(); len(evs) != 2 || evs[0].Resource.ID != "x" || evs[1].Resource.ID != "y" {
		t.Fatalf("the current state: %+v", evs)
	}
	if evs := both.Pending(); len(evs) != 0 {
		t.Fatalf("no news, yet %+v", evs)
	}
	_, _ = s.Put("o", "b", "y", 20)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if evs, err := both.Next(ctx); err != nil || len(evs) != 1 || evs[0].Resource.Spec != 20 {
		t.Fatalf("after a change: %+v %v", evs, err)
	}
}

// Await returns at once for a resource that is already as wanted, waits through versions it does
// not accept, and gives up when its context ends.
func TestAwait(t *testing.T) {
	s := NewState()
	_ = s.Claim("a", "o")
	_, _ = s.Put("o", "a", "x", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r, err := s.Await(ctx, "a", "x", nil); err != nil || r.Spec != 1 {
		t.Fatalf("already there: %+v %v", r, err)
	}
	atLeast3 := func(r Resource) bool { return r.Spec.(int) >= 3 }
	done := make(chan Resource, 1)
	go func() {
		r, err := s.Await(ctx, "a", "x", atLeast3)
		if err != nil {
			t.Errorf("await: %v", err)
		}
		done <- r
	}()
	for v := 2; v <= 4; v++ {
		_, _ = s.Put("o", "a", "x", v)
	}
	if r := <-done; r.Spec.(int) < 3 {
		t.Fatalf("took %+v, which it should not accept", r)
	}
	short, stop := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer stop()
	if _, err := s.Await(short, "a", "missing", nil); err == nil {
		t.Fatal("a resource that never comes: no error")
	}
}
