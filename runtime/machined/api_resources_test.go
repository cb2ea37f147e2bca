package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/machined/internal/resource"
)

// closeSignal wraps a machine's watches so the test learns when the API has closed one.
type closeSignal struct {
	*machine
	closed chan struct{} // a value for each watch closed
}

type signalledWatch struct {
	resourceWatch
	once   sync.Once
	closed chan struct{}
}

func (w *signalledWatch) Close() {
	w.resourceWatch.Close()
	w.once.Do(func() { w.closed <- struct{}{} })
}

func (c *closeSignal) WatchResources(t, id string) (resourceWatch, error) {
	w, err := c.machine.WatchResources(t, id)
	if err != nil {
		return nil, err
	}
	return &signalledWatch{resourceWatch: w, closed: c.closed}, nil
}

// watchMachine is a booted test machine (api_config_test.go) whose API tells when a watch ends.
func watchMachine(t *testing.T) (*configMachine, *authAPI, chan struct{}) {
	t.Helper()
	c := newConfigMachine(t)
	signal := &closeSignal{machine: c.machine, closed: make(chan struct{}, 16)}
	return c, serveAuthAPI(t, defaultAPILimits, signal), signal.closed
}

// stream is one watch request's lines as they come.
type stream struct {
	resp  *http.Response
	lines *bufio.Scanner
}

func openWatch(t *testing.T, ctx context.Context, a *authAPI, query string) *stream {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.url+"/v1/resources?watch=1"+query, nil)
	c := a.client(t, "reader")
	c.Timeout = 0 // a watch streams; the test's context ends it
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("watch: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	return &stream{resp: resp, lines: bufio.NewScanner(resp.Body)}
}

func (s *stream) next(t *testing.T) watchLine {
	t.Helper()
	if !s.lines.Scan() {
		t.Fatalf("the watch ended: %v", s.lines.Err())
	}
	var line watchLine
	if err := json.Unmarshal(s.lines.Bytes(), &line); err != nil {
		t.Fatalf("not a JSON line: %q", s.lines.Text())
	}
	return line
}

// describe is "event type/id@version", or the event alone.
func (l watchLine) describe() string {
	if l.Resource == nil {
		return l.Event
	}
	return l.Event + " " + l.Resource.Type + "/" + l.Resource.ID + "@" + strconv.FormatUint(l.Resource.Version, 10)
}

// isObserved says whether a line is of a type observed from the host or the clock (observe.go).
func isObserved(l watchLine) bool {
	if l.Resource == nil {
		return false
	}
	switch resource.Type(l.Resource.Type) {
	case linkType, addressType, serviceType, bootType, timeType, platType, upgradeType:
		return true
	}
	return false
}

// waitClosed waits for the API to close a watch.
func waitClosed(t *testing.T, closed chan struct{}, what string) {
	t.Helper()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the watch is still open after 10 s", what)
	}
}

// A watch sends the current state, "synced", then each change: here an applied config and the
// network status that follows it.
func TestWatchSendsTheStateThenEachChange(t *testing.T) {
	c, a, _ := watchMachine(t)
	s := openWatch(t, context.Background(), a, "")
	var got []string
	for line := s.next(t); line.Event != "synced"; line = s.next(t) {
		if isObserved(line) {
			continue // this host's own interfaces, not the test's
		}
		got = append(got, line.describe())
	}
	want := "current config/install/install@1, current config/kept/kept@1, current config/machine/machine@1, " +
		"current config/source/boot@1, current extension/services/services@1, current machine/stage/machine@1, " +
		"current network/status/applied@1, current service/set/services@1, current volume/status/volumes@1"
	if strings.Join(got, ", ") != want {
		t.Fatalf("current state: %v", got)
	}
	code, report, msg := c.post(t, "admin", "", appliedConfig)
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, msg)
	}
	seen := map[string]bool{}
	for !seen["updated network/status/applied@2"] {
		line := s.next(t)
		seen[line.describe()] = true
		if line.Resource != nil && line.Resource.Type == "config/machine" {
			spec, _ := json.Marshal(line.Resource.Spec)
			if !strings.Contains(string(spec), `"hostname":"node-2"`) {
				t.Errorf("config/machine's spec: %s", spec)
			}
		}
	}
	if !seen["updated config/applied/applied@1"] || !seen["updated config/machine/machine@2"] || report.ConfigVersion != 2 {
		t.Errorf("lines %v, report %+v", seen, report)
	}
}

// A watch of one type and ID sends only it; an unknown type is 404, a bad watch= 400.
func TestWatchOfOneResourceAndRefusals(t *testing.T) {
	_, a, _ := watchMachine(t)
	s := openWatch(t, context.Background(), a, "&type=network/status&id=applied")
	if line := s.next(t); line.describe() != "current network/status/applied@1" {
		t.Fatalf("%s", line.describe())
	}
	if line := s.next(t); line.Event != "synced" {
		t.Fatalf("%s", line.describe())
	}
	reader := a.client(t, "reader")
	for query, want := range map[string]int{"?watch=1&type=nosuch/type": 404, "?watch=maybe": 400} {
		if code, msg := do(t, reader, "GET", a.url+"/v1/resources"+query, ""); code != want {
			t.Errorf("%s: %d %q, want %d", query, code, msg, want)
		}
	}
	resp, err := reader.Get(a.url + "/v1/resources?type=config/machine&id=machine")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct{ Resources []apiResource }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Resources) != 1 || list.Resources[0].ID != "machine" {
		t.Errorf("GET with an id: %+v %v", list, err)
	}
}

// A client that goes away ends its watch on the machine: the watch is closed (no goroutine
// left waiting on it) and its place is free again.
func TestWatchEndsWhenTheClientGoesAway(t *testing.T) {
	_, a, closed := watchMachine(t)
	for i := 0; i < maxWatchesPerSource+1; i++ { // more than the per-source bound: each place came back
		ctx, cancel := context.WithCancel(context.Background())
		s := openWatch(t, ctx, a, "")
		for s.next(t).Event != "synced" {
		}
		cancel()
		waitClosed(t, closed, "after its client went away")
	}
}

// One source may hold maxWatchesPerSource watches; the next is refused with 429 until one ends.
func TestWatchesAreBoundedPerSource(t *testing.T) {
	_, a, closed := watchMachine(t)
	cancels := make([]context.CancelFunc, 0, maxWatchesPerSource)
	for i := 0; i < maxWatchesPerSource; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		defer cancel()
		s := openWatch(t, ctx, a, "")
		for s.next(t).Event != "synced" {
		}
	}
	code, msg := do(t, a.client(t, "reader"), "GET", a.url+"/v1/resources?watch=1", "")
	if code != http.StatusTooManyRequests || !strings.Contains(msg, "too many watches") {
		t.Fatalf("one watch too many: %d %q", code, msg)
	}
	cancels[0]()
	waitClosed(t, closed, "after its client went away")
	s := openWatch(t, context.Background(), a, "")
	if line := s.next(t); line.Event != "current" {
		t.Fatalf("%s", line.describe())
	}
}

// A watch ends after watchLifetime with "expired"; the lifetime stays under the read timeout
// that would end it without that line.
func TestWatchExpires(t *testing.T) {
	if watchLifetime >= defaultAPILimits.ReadTimeout {
		t.Fatalf("watchLifetime %s is not under the API's ReadTimeout %s", watchLifetime, defaultAPILimits.ReadTimeout)
	}
	saved := watchLifetime
	watchLifetime = 100 * time.Millisecond
	defer func() { watchLifetime = saved }()
	_, a, closed := watchMachine(t)
	s := openWatch(t, context.Background(), a, "")
	last := ""
	for s.lines.Scan() {
		var line watchLine
		_ = json.Unmarshal(s.lines.Bytes(), &line)
		last = line.Event
	}
	if last != "expired" {
		t.Fatalf("the last line: %q", last)
	}
	waitClosed(t, closed, "after it expired")
}
