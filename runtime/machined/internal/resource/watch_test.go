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
