package resource

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestOwnership(t *testing.T) {
	s := NewState()
	if err := s.Claim("net/address", "addresses"); err != nil {
		t.Fatal(err)
	}
	if err := s.Claim("net/address", "addresses"); err != nil {
		t.Fatalf("the owner claiming again: %v", err)
	}
	if _, err := s.Put("addresses", "net/address", "eth0", "10.0.0.2/24"); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		write func() error
		want  error
	}{
		{"claim by another", func() error { return s.Claim("net/address", "routes") }, ErrOwned},
		{"put by another", func() error { _, err := s.Put("routes", "net/address", "eth0", "x"); return err }, ErrNotOwner},
		{"put by no one", func() error { _, err := s.Put("", "net/unclaimed", "a", "x"); return err }, ErrNotOwner},
		{"teardown by another", func() error { return s.Teardown("routes", "net/address", "eth0") }, ErrNotOwner},
		{"destroy by another", func() error { return s.Destroy("routes", "net/address", "eth0") }, ErrNotOwner},
		{"destroy of nothing", func() error { return s.Destroy("addresses", "net/address", "eth9") }, ErrNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.write(); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	if r, _ := s.Get("net/address", "eth0"); r.Spec != "10.0.0.2/24" || r.Version != 1 {
		t.Fatalf("a refused write changed the resource: %+v", r)
	}

	rt := NewRuntime(s, t.Logf)
	err := rt.Register(&funcController{name: "thief", outputs: []Type{"net/address"}})
	if !errors.Is(err, ErrOwned) {
		t.Fatalf("a second controller registered an owned output: %v", err)
	}
}

func TestVersions(t *testing.T) {
	s := NewState()
	_ = s.Claim("t", "o")
	steps := []struct {
		name    string
		do      func() error
		version uint64
		phase   Phase
	}{
		{"create", func() error { _, err := s.Put("o", "t", "a", 1); return err }, 1, Running},
		{"change", func() error { _, err := s.Put("o", "t", "a", 2); return err }, 2, Running},
		{"same spec is no change", func() error { _, err := s.Put("o", "t", "a", 2); return err }, 2, Running},
		{"teardown", func() error { return s.Teardown("o", "t", "a") }, 3, TearingDown},
		{"teardown again is no change", func() error { return s.Teardown("o", "t", "a") }, 3, TearingDown},
		{"running again with the same spec", func() error { _, err := s.Put("o", "t", "a", 2); return err }, 4, Running},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		r, ok := s.Get("t", "a")
		if !ok || r.Version != st.version || r.Phase != st.phase || r.Owner != "o" {
			t.Fatalf("%s: got %+v, want version %d %s", st.name, r.Metadata, st.version, st.phase)
		}
	}
	if err := s.Destroy("o", "t", "a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get("t", "a"); ok {
		t.Fatal("destroyed resource still there")
	}
}

func TestListSortedAndTyped(t *testing.T) {
	s := NewState()
	_ = s.Claim("a", "o")
	_ = s.Claim("b", "o")
	for _, id := range []string{"z", "m", "c"} {
		_, _ = s.Put("o", "a", id, id)
	}
	_, _ = s.Put("o", "b", "x", 1)
	var ids []string
	for _, r := range s.List("a") {
		ids = append(ids, r.ID)
	}
	if fmt.Sprint(ids) != "[c m z]" {
		t.Fatalf("List = %v", ids)
	}
	r, _ := s.Get("b", "x")
	if n, ok := SpecOf[int](r); !ok || n != 1 {
		t.Fatalf("SpecOf[int] = %v, %v", n, ok)
	}
	if _, ok := SpecOf[string](r); ok {
		t.Fatal("SpecOf[string] of an int spec")
	}
}

// A slow watcher misses intermediate versions but always ends on the latest, and the writer
// never waits for it.
func TestWatchCoalescesForSlowWatcher(t *testing.T) {
	s := NewState()
	_ = s.Claim("t", "o")
	_, _ = s.Put("o", "t", "a", 0)
	all, one := s.Watch("t", ""), s.Watch("t", "b")
	defer all.Close()
	defer one.Close()

	start := time.Now()
	for i := 1; i <= 10000; i++ { // no one reads meanwhile: a blocking writer would hang here
		_, _ = s.Put("o", "t", "a", i)
		_, _ = s.Put("o", "t", "b", -i)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("writes took %s with a watcher not reading", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := all.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Resource.Spec != 10000 || evs[1].Resource.Spec != -10000 {
		t.Fatalf("coalesced events: %+v", evs)
	}
	if evs[0].Resource.Version != 10001 {
		t.Fatalf("latest version %d, want 10001", evs[0].Resource.Version)
	}
	evs, err = one.Next(ctx)
	if err != nil || len(evs) != 1 || evs[0].Resource.ID != "b" || evs[0].Resource.Spec != -10000 {
		t.Fatalf("watch of one ID: %+v %v", evs, err)
	}

	// destroyed after a change: the watcher sees only that it is gone
	_, _ = s.Put("o", "t", "b", 1)
	_ = s.Destroy("o", "t", "b")
	evs, err = one.Next(ctx)
	if err != nil || len(evs) != 1 || evs[0].Kind != Destroyed {
		t.Fatalf("after destroy: %+v %v", evs, err)
	}
	// nothing more: Next waits until ctx ends
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	if evs, err := one.Next(short); err == nil {
		t.Fatalf("news from nowhere: %+v", evs)
	}
}

// Many writers and watchers at once, some watchers slow, under -race: every watcher ends on
// each resource's final version, versions it sees only go up, and Get and List stay whole.
func TestConcurrentWritersAndWatchers(t *testing.T) {
	const writers, ids, writes, watchers = 8, 4, 300, 12
	s := NewState()
	for w := 0; w < writers; w++ {
		_ = s.Claim(Type(fmt.Sprint("type", w)), fmt.Sprint("owner", w))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	type seen struct {
		last map[key]uint64
		err  error
	}
	results := make([]seen, watchers)
	var watchWG sync.WaitGroup
	ready := make(chan struct{}, watchers)
	for i := 0; i < watchers; i++ {
		i := i
		typ := Type(fmt.Sprint("type", i%writers))
		id := ""
		if i%3 == 0 {
			id = "id1"
		}
		watchWG.Add(1)
		go func() {
			defer watchWG.Done()
			w := s.Watch(typ, id)
			defer w.Close()
			ready <- struct{}{}
			last := map[key]uint64{}
			for {
				evs, err := w.Next(ctx)
				if err != nil {
					results[i] = seen{last, err}
					return
				}
				for _, ev := range evs {
					k := key{ev.Resource.Type, ev.Resource.ID}
					if ev.Resource.Version <= last[k] {
						results[i] = seen{last, fmt.Errorf("%v: version %d after %d", k, ev.Resource.Version, last[k])}
						return
					}
					last[k] = ev.Resource.Version
				}
				if i%2 == 1 {
					time.Sleep(time.Millisecond) // a slow watcher
				}
				if done(last, id, ids, writes) {
					results[i] = seen{last, nil}
					return
				}
			}
		}()
	}
	for i := 0; i < watchers; i++ {
		<-ready
	}

	var writeWG sync.WaitGroup
	for w := 0; w < writers; w++ {
		w := w
		writeWG.Add(2)
		go func() {
			defer writeWG.Done()
			typ, owner := Type(fmt.Sprint("type", w)), fmt.Sprint("owner", w)
			for n := 1; n <= writes; n++ {
				for i := 0; i < ids; i++ {
					if _, err := s.Put(owner, typ, fmt.Sprint("id", i), []int{n}); err != nil {
						t.Error(err)
					}
				}
			}
		}()
		go func() { // a reader racing the writer
			defer writeWG.Done()
			typ := Type(fmt.Sprint("type", w))
			for n := 0; n < writes; n++ {
				for _, r := range s.List(typ) {
					if v := r.Spec.([]int)[0]; uint64(v) != r.Version {
						t.Errorf("%s/%s: spec %d at version %d", r.Type, r.ID, v, r.Version)
					}
				}
				_, _ = s.Get(typ, "id0")
			}
		}()
	}
	writeWG.Wait()
	watchWG.Wait()
	for i, r := range results {
		if r.err != nil {
			t.Errorf("watcher %d: %v", i, r.err)
		}
	}
}

// done says whether a watcher has seen the final version of everything it watches.
func done(last map[key]uint64, id string, ids, writes int) bool {
	want := ids
	if id != "" {
		want = 1
	}
	if len(last) != want {
		return false
	}
	for _, v := range last {
		if v != uint64(writes) {
			return false
		}
	}
	return true
}
