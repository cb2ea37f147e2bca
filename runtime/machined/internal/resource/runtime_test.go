package resource

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kiln/machined/internal/testkit"
)

// funcController is a controller made of a function.
type funcController struct {
	name            string
	inputs, outputs []Type
	reconcile       func(ctx context.Context, r *Run) error
	runs            atomic.Int64
}

func (c *funcController) Name() string    { return c.name }
func (c *funcController) Inputs() []Type  { return c.inputs }
func (c *funcController) Outputs() []Type { return c.outputs }
func (c *funcController) Reconcile(ctx context.Context, r *Run) error {
	c.runs.Add(1)
	if c.reconcile == nil {
		return nil
	}
	return c.reconcile(ctx, r)
}

// start runs rt until the test ends (or stop is called) and waits for Run to return then.
func start(t *testing.T, rt *Runtime) (stop func()) {
	return testkit.RunUntilStopped(t, 10*time.Second, rt.Run)
}

// waitFor watches one resource until cond holds for it (ok is false while it does not exist).
func waitFor(t *testing.T, s *State, typ Type, id string, cond func(r Resource, ok bool) bool) Resource {
	t.Helper()
	w := s.Watch(typ, id)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		r, ok := s.Get(typ, id)
		if cond(r, ok) {
			return r
		}
		if _, err := w.Next(ctx); err != nil {
			t.Fatalf("%s/%s never got there; last %+v (exists %v)", typ, id, r, ok)
		}
	}
}

func specIs(want interface{}) func(Resource, bool) bool {
	return func(r Resource, ok bool) bool { return ok && fmt.Sprint(r.Spec) == fmt.Sprint(want) }
}

// chain is config -> A (doubles) -> B (adds one) -> C (formats): each reads the one before.
func chain() []*funcController {
	read := func(r *Run, t Type) (int, bool) {
		res, ok := r.Get(t, "x")
		if !ok {
			return 0, false
		}
		n, ok := SpecOf[int](res)
		return n, ok
	}
	return []*funcController{
		{name: "A", inputs: []Type{"config"}, outputs: []Type{"a"}, reconcile: func(_ context.Context, r *Run) error {
			if n, ok := read(r, "config"); ok {
				return r.Put("a", "x", n*2)
			}
			return nil
		}},
		{name: "B", inputs: []Type{"a"}, outputs: []Type{"b"}, reconcile: func(_ context.Context, r *Run) error {
			if n, ok := read(r, "a"); ok {
				return r.Put("b", "x", n+1)
			}
			return nil
		}},
		{name: "C", inputs: []Type{"b"}, outputs: []Type{"c"}, reconcile: func(_ context.Context, r *Run) error {
			if n, ok := read(r, "b"); ok {
				return r.Put("c", "x", fmt.Sprintf("value %d", n))
			}
			return nil
		}},
	}
}

// A chain converges whatever order its controllers are registered (and so started) in, and
// whether its input is there before the start or comes after; it re-runs on input change.
func TestChainConvergesInAnyOrder(t *testing.T) {
	orders := [][]int{{0, 1, 2}, {2, 1, 0}, {1, 2, 0}, {2, 0, 1}}
	for _, order := range orders {
		for _, early := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v early=%v", order, early), func(t *testing.T) {
				s := NewState()
				_ = s.Claim("config", "user")
				if early {
					_, _ = s.Put("user", "config", "x", 5)
				}
				rt := NewRuntime(s, t.Logf)
				ctrls := chain()
				for _, i := range order {
					if err := rt.Register(ctrls[i]); err != nil {
						t.Fatal(err)
					}
				}
				start(t, rt)
				if !early {
					_, _ = s.Put("user", "config", "x", 5)
				}
				waitFor(t, s, "c", "x", specIs("value 11"))

				// an input change runs the chain again
				_, _ = s.Put("user", "config", "x", 20)
				r := waitFor(t, s, "c", "x", specIs("value 41"))
				if r.Version != 2 {
					t.Fatalf("c changed %d times for two inputs", r.Version)
				}
			})
		}
	}
}

// A no-op change upstream (same spec) wakes no one downstream.
func TestUnchangedOutputDoesNotRerun(t *testing.T) {
	s := NewState()
	_ = s.Claim("config", "user")
	_, _ = s.Put("user", "config", "x", 1)
	rt := NewRuntime(s, t.Logf)
	ctrls := chain()
	for _, c := range ctrls {
		_ = rt.Register(c)
	}
	start(t, rt)
	waitFor(t, s, "c", "x", specIs("value 3"))
	runsB := ctrls[1].runs.Load()
	_, _ = s.Put("user", "config", "x", 1) // the same: no change
	_, _ = s.Put("user", "config", "y", 7) // another ID: A runs, puts the same a/x
	waitFor(t, s, "config", "y", specIs(7))
	// A reacts to config/y; wait until it has run for it (its run count passes 2)
	deadline := time.Now().Add(10 * time.Second)
	for ctrls[0].runs.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("A never ran again")
		}
		runtime.Gosched()
	}
	if got := ctrls[1].runs.Load(); got != runsB {
		t.Fatalf("B ran %d times more though a/x did not change", got-runsB)
	}
}

// Outputs a controller no longer puts are torn down (watchers see it) and destroyed.
func TestStaleOutputsRemoved(t *testing.T) {
	s := NewState()
	_ = s.Claim("config", "user")
	_, _ = s.Put("user", "config", "addresses", []string{"10.0.0.1", "10.0.0.2"})
	rt := NewRuntime(s, t.Logf)
	_ = rt.Register(&funcController{name: "addresses", inputs: []Type{"config"}, outputs: []Type{"address"},
		reconcile: func(_ context.Context, r *Run) error {
			cfg, _ := r.Get("config", "addresses")
			want, _ := SpecOf[[]string](cfg)
			for _, a := range want {
				if err := r.Put("address", a, "up"); err != nil {
					return err
				}
			}
			return nil
		}})
	w := s.Watch("address", "10.0.0.1")
	defer w.Close()
	start(t, rt)
	waitFor(t, s, "address", "10.0.0.2", specIs("up"))
	_, _ = s.Put("user", "config", "addresses", []string{"10.0.0.2", "10.0.0.3"})
	waitFor(t, s, "address", "10.0.0.3", specIs("up"))
	waitFor(t, s, "address", "10.0.0.1", func(_ Resource, ok bool) bool { return !ok })

	var ids []string
	for _, r := range s.List("address") {
		ids = append(ids, r.ID)
	}
	if fmt.Sprint(ids) != "[10.0.0.2 10.0.0.3]" {
		t.Fatalf("addresses left: %v", ids)
	}
	// the watcher of the stale one ends on its destruction
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var last Event
	for last.Kind != Destroyed {
		evs, err := w.Next(ctx)
		if err != nil {
			t.Fatal("no Destroyed event for the stale address")
		}
		last = evs[len(evs)-1]
	}
	if last.Resource.Phase != TearingDown {
		t.Fatalf("destroyed without tearing down first: %+v", last.Resource.Metadata)
	}
}

// A controller that panics is reported and run again with backoff until it succeeds, and the
// other controllers keep running meanwhile.
func TestPanicRecoveredAndRetried(t *testing.T) {
	s := NewState()
	var log testkit.Lines // what the runtime reports, from every controller goroutine
	rt := NewRuntime(s, log.Add)
	var backoffs []int
	var mu sync.Mutex
	rt.Backoff = func(n int) time.Duration {
		mu.Lock()
		backoffs = append(backoffs, n)
		mu.Unlock()
		return time.Millisecond
	}
	var calls atomic.Int64
	_ = rt.Register(&funcController{name: "flaky", outputs: []Type{"out"}, reconcile: func(_ context.Context, r *Run) error {
		switch calls.Add(1) {
		case 1, 2:
			var m map[string]int
			m["boom"] = 1 // a nil map write: a real runtime panic
		case 3:
			return errors.New("not yet")
		}
		return r.Put("out", "x", "ok")
	}})
	_ = rt.Register(&funcController{name: "steady", outputs: []Type{"steady"}, reconcile: func(_ context.Context, r *Run) error {
		return r.Put("steady", "x", "ok")
	}})
	start(t, rt)
	waitFor(t, s, "steady", "x", specIs("ok"))
	waitFor(t, s, "out", "x", specIs("ok"))
	text := log.Join("\n")
	if !strings.Contains(text, "controller flaky: panic: assignment to entry in nil map") ||
		!strings.Contains(text, "controller flaky: not yet") {
		t.Fatalf("reports:\n%s", text)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(backoffs) != "[1 2 3]" {
		t.Fatalf("backoff asked for %v, want [1 2 3]", backoffs)
	}
}

func TestDefaultBackoff(t *testing.T) {
	cases := []struct {
		n    int
		want time.Duration
	}{{1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {4, 800 * time.Millisecond}, {20, 30 * time.Second}, {1000, 30 * time.Second}}
	for _, c := range cases {
		if got := DefaultBackoff(c.n); got != c.want {
			t.Errorf("DefaultBackoff(%d) = %s, want %s", c.n, got, c.want)
		}
	}
}

// Cancelling the context stops every controller, also one in backoff and one blocked in its
// Reconcile on ctx, and leaves no goroutine behind.
func TestShutdownLeavesNoGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	s := NewState()
	_ = s.Claim("config", "user")
	_, _ = s.Put("user", "config", "x", 1)
	rt := NewRuntime(s, func(string, ...interface{}) {})
	rt.Backoff = func(int) time.Duration { return time.Hour }
	for _, c := range chain() {
		_ = rt.Register(c)
	}
	blocked := make(chan struct{})
	_ = rt.Register(&funcController{name: "blocks", reconcile: func(ctx context.Context, _ *Run) error {
		close(blocked)
		<-ctx.Done()
		return ctx.Err()
	}})
	_ = rt.Register(&funcController{name: "fails", reconcile: func(context.Context, *Run) error { return errors.New("always") }})
	stop := start(t, rt)
	waitFor(t, s, "c", "x", specIs("value 3"))
	<-blocked
	stop()

	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
	}
}

// periodicController re-reads something outside the state each period.
type periodicController struct {
	funcController
	every time.Duration
}

func (c *periodicController) Every() time.Duration { return c.every }

// A Periodic controller sees a change outside the state on its next period, without any input
// changing; one that is not Periodic runs only when its inputs change.
func TestPeriodicControllerObservesOutsideChanges(t *testing.T) {
	s := NewState()
	var outside atomic.Int64
	outside.Store(1)
	observe := func(_ context.Context, r *Run) error { return r.Put("seen", "x", outside.Load()) }
	rt := NewRuntime(s, t.Logf)
	periodic := &periodicController{funcController{name: "observer", outputs: []Type{"seen"}, reconcile: observe}, 20 * time.Millisecond}
	plain := &funcController{name: "plain", inputs: []Type{"nothing"}, outputs: []Type{"other"}}
	_ = rt.Register(periodic)
	_ = rt.Register(plain)
	start(t, rt)
	waitFor(t, s, "seen", "x", specIs(int64(1)))
	outside.Store(2)
	waitFor(t, s, "seen", "x", specIs(int64(2)))
	if runs := plain.runs.Load(); runs > 1 {
		t.Fatalf("a controller without a period ran %d times with no input change", runs)
	}
}
