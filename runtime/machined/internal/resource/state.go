// Package resource is machined's resource runtime: typed resources in one state store, each
// type owned by one controller, and a runtime that re-runs a controller whenever a resource
// it reads changes, until nothing changes any more (the shape of Talos's COSI).
//
// The point is that the machine converges whatever order things happen in: a controller says
// what it reads and what it writes, and reacts to the present state instead of being one step
// of a fixed boot sequence. One owner per type means exactly one place decides each fact.
package resource

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
)

// Type names a kind of resource ("network/address", "time/status").
type Type string

// Phase is where a resource is in its life.
type Phase int

const (
	// Running: the owner wants the resource; readers act on it.
	Running Phase = iota
	// TearingDown: the owner no longer wants it and is about to destroy it; readers undo
	// whatever they did for it.
	TearingDown
)

func (p Phase) String() string {
	if p == TearingDown {
		return "tearing down"
	}
	return "running"
}

// Metadata says which resource this is and which change of it.
type Metadata struct {
	Type    Type
	ID      string
	Version uint64 // 1 when created, +1 on every change its owner makes
	Phase   Phase
	Owner   string // the controller that owns Type
}

// Resource is one typed fact. Spec is a value the store hands out to every reader as is:
// never modify a spec after putting it, put a new one (readers run concurrently).
type Resource struct {
	Metadata
	Spec interface{}
}

// SpecOf returns r's spec as a T, and whether it is one.
func SpecOf[T any](r Resource) (T, bool) {
	t, ok := r.Spec.(T)
	return t, ok
}

var (
	// ErrNotOwner: a write to a type by someone who does not own it.
	ErrNotOwner = errors.New("not the owner of this resource type")
	// ErrOwned: a second owner claiming a type.
	ErrOwned = errors.New("resource type already has an owner")
	// ErrNotFound: the resource does not exist.
	ErrNotFound = errors.New("resource not found")
)

type key struct {
	t  Type
	id string
}

// State holds every resource. Reads copy out under one lock; writes check ownership and tell
// the watchers without ever waiting for them.
type State struct {
	mu       sync.Mutex
	owners   map[Type]string
	res      map[key]*Resource
	watchers map[*Watch]struct{}
}

// NewState is an empty store.
func NewState() *State {
	return &State{owners: map[Type]string{}, res: map[key]*Resource{}, watchers: map[*Watch]struct{}{}}
}

// Claim makes owner the only writer of t; a second, different owner is refused.
func (s *State) Claim(t Type, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.owners[t]; ok && cur != owner {
		return fmt.Errorf("%s: %w (%s)", t, ErrOwned, cur)
	}
	s.owners[t] = owner
	return nil
}

// Get returns a copy of one resource.
func (s *State) Get(t Type, id string) (Resource, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.res[key{t, id}]
	if !ok {
		return Resource{}, false
	}
	return *r, true
}

// List returns copies of every resource of t, sorted by ID.
func (s *State) List(t Type) []Resource {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Resource
	for k, r := range s.res {
		if k.t == t {
			out = append(out, *r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (s *State) checkOwner(owner string, t Type) error {
	if s.owners[t] != owner || owner == "" {
		return fmt.Errorf("%s writing %s: %w", owner, t, ErrNotOwner)
	}
	return nil
}

// Put creates or updates a resource as running with spec. A write that changes nothing (same
// spec, already running) keeps the version and wakes no one: that is what lets a set of
// controllers that feed each other come to rest. It reports whether anything changed.
func (s *State) Put(owner string, t Type, id string, spec interface{}) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOwner(owner, t); err != nil {
		return false, err
	}
	k := key{t, id}
	r, ok := s.res[k]
	if ok && r.Phase == Running && reflect.DeepEqual(r.Spec, spec) {
		return false, nil
	}
	if !ok {
		r = &Resource{Metadata: Metadata{Type: t, ID: id, Owner: owner}}
		s.res[k] = r
	}
	r.Version++
	r.Phase, r.Spec = Running, spec
	s.notify(Event{Kind: Updated, Resource: *r})
	return true, nil
}

// Teardown moves a resource to TearingDown (a change: its version goes up), so readers see it
// is going before it is gone.
func (s *State) Teardown(owner string, t Type, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOwner(owner, t); err != nil {
		return err
	}
	r, ok := s.res[key{t, id}]
	if !ok {
		return fmt.Errorf("%s/%s: %w", t, id, ErrNotFound)
	}
	if r.Phase != TearingDown {
		r.Version++
		r.Phase = TearingDown
		s.notify(Event{Kind: Updated, Resource: *r})
	}
	return nil
}

// Destroy removes a resource; watchers get its last state with a Destroyed event.
func (s *State) Destroy(owner string, t Type, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.checkOwner(owner, t); err != nil {
		return err
	}
	k := key{t, id}
	r, ok := s.res[k]
	if !ok {
		return fmt.Errorf("%s/%s: %w", t, id, ErrNotFound)
	}
	delete(s.res, k)
	s.notify(Event{Kind: Destroyed, Resource: *r})
	return nil
}

// ids lists the IDs of t's resources.
func (s *State) ids(t Type) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.res {
		if k.t == t {
			out = append(out, k.id)
		}
	}
	return out
}

// notify hands ev to every watcher it matches; s.mu is held.
func (s *State) notify(ev Event) {
	for w := range s.watchers {
		if w.matches(ev.Resource.Metadata) {
			w.push(ev)
		}
	}
}
