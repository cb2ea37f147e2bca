package resource

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"kiln/machined/internal/safego"
)

// Controller owns some resource types and keeps them true to what it reads.
type Controller interface {
	// Name identifies the controller as the owner of its outputs.
	Name() string
	// Inputs are the types whose changes make the runtime run Reconcile again.
	Inputs() []Type
	// Outputs are the types the controller owns; no one else may write them.
	Outputs() []Type
	// Reconcile reads the present state and puts every output resource it wants now. Whatever
	// of its outputs a successful run did not put is torn down and destroyed after it, so a
	// controller says the whole set it wants and never tracks what it made before. An error
	// (or a panic) keeps the outputs as they are and retries later.
	Reconcile(ctx context.Context, r *Run) error
}

// Periodic is a controller that also re-runs every Every(), whatever its inputs do: an observer
// of something outside the state (the kernel's links and addresses, the supervisor's services),
// which no watch can tell of a change.
type Periodic interface {
	Every() time.Duration
}

// Run is one Reconcile's view of the state: reads of anything, writes of its own outputs.
type Run struct {
	state *State
	owner string
	put   map[key]bool
}

// Get returns a copy of one resource.
func (r *Run) Get(t Type, id string) (Resource, bool) { return r.state.Get(t, id) }

// List returns copies of every resource of t, sorted by ID.
func (r *Run) List(t Type) []Resource { return r.state.List(t) }

// Put creates or updates one of the controller's outputs and keeps it past this run.
func (r *Run) Put(t Type, id string, spec interface{}) error {
	if _, err := r.state.Put(r.owner, t, id, spec); err != nil {
		return err
	}
	r.put[key{t, id}] = true
	return nil
}

// Runtime runs controllers over one state, each in its own goroutine.
type Runtime struct {
	state *State
	say   func(format string, args ...interface{})
	ctrls []Controller

	// Backoff is how long to wait before the n-th retry (n from 1) of a controller whose
	// Reconcile failed or panicked; success starts the count again.
	Backoff func(n int) time.Duration
}

// NewRuntime runs controllers over state and reports their failures with say.
func NewRuntime(state *State, say func(format string, args ...interface{})) *Runtime {
	return &Runtime{state: state, say: say, Backoff: DefaultBackoff}
}

// DefaultBackoff doubles from 100 ms to at most 30 s: quick for a passing fault, and a
// controller that fails every time costs little.
func DefaultBackoff(n int) time.Duration {
	d := 100 * time.Millisecond
	for i := 1; i < n && d < 30*time.Second; i++ {
		d *= 2
	}
	if d > 30*time.Second {
		d = 30 * time.Second
	}
	return d
}

// Register adds a controller and claims its outputs; an output another controller owns is an
// error. Register every controller before Run.
func (rt *Runtime) Register(c Controller) error {
	for _, t := range c.Outputs() {
		if err := rt.state.Claim(t, c.Name()); err != nil {
			return fmt.Errorf("controller %s: %w", c.Name(), err)
		}
	}
	rt.ctrls = append(rt.ctrls, c)
	return nil
}

// Run runs every controller until ctx ends, then returns once all of their goroutines have.
func (rt *Runtime) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, c := range rt.ctrls {
		wg.Add(1)
		go func(c Controller) {
			defer wg.Done()
			rt.loop(ctx, c)
		}(c)
	}
	wg.Wait()
}

// loop reconciles c once, then again after every change of its inputs (and every period of a
// Periodic one), and after a backoff when a run fails. Changes that arrive during a run are
// coalesced into the next one.
func (rt *Runtime) loop(ctx context.Context, c Controller) {
	w := rt.state.watch(c.Inputs(), "")
	defer w.Close()
	var tick <-chan time.Time // nil, so never ready, unless c is Periodic
	if p, ok := c.(Periodic); ok && p.Every() > 0 {
		ticker := time.NewTicker(p.Every())
		defer ticker.Stop()
		tick = ticker.C
	}
	failures := 0
	for {
		w.drain() // whatever is pending now, this run reads
		if err := rt.reconcile(ctx, c); err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			rt.say("controller %s: %v; retrying (attempt %d)", c.Name(), err, failures+1)
			if !sleep(ctx, rt.Backoff(failures)) {
				return
			}
			continue
		}
		failures = 0
		select {
		case <-ctx.Done():
			return
		case <-w.Ready():
		case <-tick:
		}
	}
}

// reconcile runs Reconcile once, turns a panic into an error, and on success removes the
// outputs the run did not put.
func (rt *Runtime) reconcile(ctx context.Context, c Controller) (err error) {
	run := &Run{state: rt.state, owner: c.Name(), put: map[key]bool{}}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v; stack: %s", p, safego.OneLineStack(debug.Stack()))
		}
	}()
	if err := c.Reconcile(ctx, run); err != nil {
		return err
	}
	return rt.cleanup(run, c.Outputs())
}

// cleanup tears down and destroys every output of the run's owner that the run did not put.
func (rt *Runtime) cleanup(run *Run, outputs []Type) error {
	var errs []string
	for _, t := range outputs {
		for _, id := range rt.state.ids(t) {
			if run.put[key{t, id}] {
				continue
			}
			err := rt.state.Teardown(run.owner, t, id)
			if err == nil {
				err = rt.state.Destroy(run.owner, t, id)
			}
			if err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("removing stale outputs: %s", strings.Join(errs, "; "))
	}
	return nil
}

// sleep waits d or until ctx ends, and says whether the full d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
