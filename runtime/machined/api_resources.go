package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"kiln/machined/internal/resource"
)

// resourceWatch is what GET /v1/resources?watch=1 reads: a *resource.Watch.
type resourceWatch interface {
	Pending() []resource.Event
	Next(ctx context.Context) ([]resource.Event, error)
	Close()
}

// watchLifetime is how long one watch request streams before it ends with an "expired" line
// and the client asks again. It stays below the API's ReadTimeout: the HTTP server ends a
// request's context when that passes, and the watch would end without its last line.
var watchLifetime = 25 * time.Second

// Watches are bounded apart from connections: each holds a connection that has started a
// request, and those are what the connection limits cannot evict (api_limits.go).
const (
	maxWatches          = 32
	maxWatchesPerSource = 4
)

// watchLine is one line of a watch: "current" (the state when the watch began, then "synced"),
// "updated" and "destroyed" (a change since), or "expired" (the last line: ask again).
type watchLine struct {
	Event    string       `json:"event"`
	Resource *apiResource `json:"resource,omitempty"`
}

// resourcesHandler is GET /v1/resources[?type=TYPE][&id=ID][&watch=1]: the resources as one
// list, or, with watch, as a stream of JSON lines that goes on with every change.
func resourcesHandler(b apiBackend, watches *watchLimiter) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		watch, err := parseWatch(q.Get("watch"))
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		if watch {
			watches.serve(b, w, r, q.Get("type"), q.Get("id"))
			return
		}
		list := b.Resources(q.Get("type"))
		if id := q.Get("id"); id != "" {
			list = withID(list, id)
		}
		writeJSON(w, http.StatusOK, map[string]interface{}{"resources": list})
	}
}

func parseWatch(value string) (bool, error) {
	if value == "" {
		return false, nil
	}
	watch, err := strconv.ParseBool(value)
	if err != nil {
		return false, fmt.Errorf("watch=%q: want 1 or 0", value)
	}
	return watch, nil
}

func withID(list []apiResource, id string) []apiResource {
	out := []apiResource{}
	for _, r := range list {
		if r.ID == id {
			out = append(out, r)
		}
	}
	return out
}

// apiResourceOf is r as the API shows it.
func apiResourceOf(r resource.Resource) apiResource {
	return apiResource{Type: string(r.Type), ID: r.ID, Version: r.Version, Phase: r.Phase.String(), Owner: r.Owner, Spec: r.Spec}
}

// watchLimiter counts the watches under way, in all and per source (as connections are counted).
type watchLimiter struct {
	mu        sync.Mutex
	total     int
	perSource map[string]int
}

func newWatchLimiter() *watchLimiter { return &watchLimiter{perSource: map[string]int{}} }

func (l *watchLimiter) acquire(source string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= maxWatches || l.perSource[source] >= maxWatchesPerSource {
		return false
	}
	l.total++
	l.perSource[source]++
	return true
}

func (l *watchLimiter) release(source string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.perSource[source]--; l.perSource[source] <= 0 {
		delete(l.perSource, source)
	}
}

// requestSource is the source a request counts against: an IPv4 address or an IPv6 /64.
func requestSource(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if ip := net.ParseIP(host); err == nil && ip != nil {
		return sourceOf(&net.TCPAddr{IP: ip})
	}
	return r.RemoteAddr
}

// serve streams one watch, if the source and the machine have room for it: 429 when they do not.
func (l *watchLimiter) serve(b apiBackend, w http.ResponseWriter, r *http.Request, t, id string) {
	source := requestSource(r)
	if !l.acquire(source) {
		writeJSON(w, http.StatusTooManyRequests, map[string]string{"error": fmt.Sprintf(
			"too many watches: at most %d at once from one address and %d in all", maxWatchesPerSource, maxWatches)})
		return
	}
	defer l.release(source)
	watch, err := b.WatchResources(t, id)
	if err != nil {
		writeError(w, err, http.StatusInternalServerError)
		return
	}
	defer watch.Close()
	streamWatch(w, r, watch)
}

// streamWatch writes the current state, "synced", then each change as it comes, one JSON object
// a line, flushed, until the client goes away (the request's context ends) or watchLifetime
// passes ("expired").
func streamWatch(w http.ResponseWriter, r *http.Request, watch resourceWatch) {
	ctx, cancel := context.WithTimeout(r.Context(), watchLifetime)
	defer cancel()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	send := func(evs []resource.Event, current bool, last string) error {
		for _, ev := range evs {
			if err := enc.Encode(watchLineOf(ev, current)); err != nil {
				return err
			}
		}
		if last != "" {
			if err := enc.Encode(watchLine{Event: last}); err != nil {
				return err
			}
		}
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		return nil
	}
	if send(watch.Pending(), true, "synced") != nil {
		return
	}
	for {
		evs, err := watch.Next(ctx)
		if err != nil {
			if r.Context().Err() == nil {
				_ = send(nil, false, "expired")
			}
			return
		}
		if send(evs, false, "") != nil {
			return
		}
	}
}

func watchLineOf(ev resource.Event, current bool) watchLine {
	res := apiResourceOf(ev.Resource)
	switch {
	case ev.Kind == resource.Destroyed:
		return watchLine{Event: "destroyed", Resource: &res}
	case current:
		return watchLine{Event: "current", Resource: &res}
	}
	return watchLine{Event: "updated", Resource: &res}
}

// WatchResources watches the machine's resources of type t (every type when t is ""), of one
// ID when id is given; an unknown type is refused, as is a machine without resources yet.
func (m *machine) WatchResources(t, id string) (resourceWatch, error) {
	if m.resources == nil {
		return nil, &apiError{http.StatusConflict, "this machine keeps no resources (yet)"}
	}
	types, t := resourceTypes, canonicalType(t)
	if t != "" {
		types = nil
		for _, known := range resourceTypes {
			if string(known) == t {
				types = []resource.Type{known}
			}
		}
		if types == nil {
			return nil, &apiError{http.StatusNotFound, fmt.Sprintf("no such resource type: %s (there are %v)", t, resourceTypes)}
		}
	}
	return m.resources.WatchTypes(types, id), nil
}
