package resource

import (
	"context"
	"sort"
	"sync"
)

// EventKind says what happened to a resource.
type EventKind int

const (
	// Updated: the resource was created or changed; Resource is its latest state.
	Updated EventKind = iota
	// Destroyed: the resource is gone; Resource is its last state.
	Destroyed
)

// Event is the latest news of one resource.
type Event struct {
	Kind     EventKind
	Resource Resource
}

// Watch follows resources of some types, or one resource. It keeps only the latest event per
// resource until it is read, so a slow reader skips intermediate versions but never misses the
// present state, and a writer never waits for a reader.
type Watch struct {
	state *State
	match map[Type]bool
	id    string // "" for every ID

	mu      sync.Mutex
	pending map[key]Event
	wake    chan struct{} // holds one token while pending has news
}

// Watch follows resources of type t (every ID when id is ""). The first Next returns the
// current state of each, so a watcher needs no separate List. Close it when done.
func (s *State) Watch(t Type, id string) *Watch {
	return s.watch([]Type{t}, id)
}

// WatchTypes follows resources of several types (every ID when id is ""), as Watch does one.
func (s *State) WatchTypes(types []Type, id string) *Watch {
	return s.watch(types, id)
}

func (s *State) watch(types []Type, id string) *Watch {
	w := &Watch{state: s, match: map[Type]bool{}, id: id, pending: map[key]Event{}, wake: make(chan struct{}, 1)}
	for _, t := range types {
		w.match[t] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, r := range s.res {
		if w.matches(r.Metadata) {
			w.pending[k] = Event{Kind: Updated, Resource: *r}
		}
	}
	if len(w.pending) > 0 {
		w.wake <- struct{}{}
	}
	s.watchers[w] = struct{}{}
	return w
}

// Close stops the watch; it is safe to call more than once.
func (w *Watch) Close() {
	w.state.mu.Lock()
	defer w.state.mu.Unlock()
	delete(w.state.watchers, w)
}

func (w *Watch) matches(md Metadata) bool {
	return w.match[md.Type] && (w.id == "" || w.id == md.ID)
}

// push records ev as the latest for its resource and wakes the reader without blocking. The
// token goes in under w.mu, so drain takes events and token together: a token never outlives
// the events it announced (which would wake the reader for nothing).
func (w *Watch) push(ev Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending[key{ev.Resource.Type, ev.Resource.ID}] = ev
	select {
	case w.wake <- struct{}{}:
	default: // already woken: the reader will find this event with the others
	}
}

// Ready is a channel that has a value when Next has news; for select loops.
func (w *Watch) Ready() <-chan struct{} { return w.wake }

// Next waits for news (or ctx's end) and returns the latest event of each resource that changed
// since the last call, sorted by type and ID.
func (w *Watch) Next(ctx context.Context) ([]Event, error) {
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.wake:
		}
		if evs := w.drain(); len(evs) > 0 {
			return evs, nil
		}
	}
}

// Await waits until resource t/id is running and accept (nil: any) takes it, or ctx ends, and
// returns the resource it took: how a step that needs a controller's result waits for it.
func (s *State) Await(ctx context.Context, t Type, id string, accept func(Resource) bool) (Resource, error) {
	w := s.Watch(t, id)
	defer w.Close()
	for {
		if r, ok := s.Get(t, id); ok && r.Phase == Running && (accept == nil || accept(r)) {
			return r, nil
		}
		if _, err := w.Next(ctx); err != nil {
			return Resource{}, err
		}
	}
}

// Pending returns what Next would return now, without waiting: nothing when there is no news.
// Right after Watch it is the current state of every resource watched, which may be none.
func (w *Watch) Pending() []Event { return w.drain() }

// drain takes every pending event.
func (w *Watch) drain() []Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.wake:
	default:
	}
	out := make([]Event, 0, len(w.pending))
	for k, ev := range w.pending {
		out = append(out, ev)
		delete(w.pending, k)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Resource, out[j].Resource
		return a.Type < b.Type || (a.Type == b.Type && a.ID < b.ID)
	})
	return out
}
