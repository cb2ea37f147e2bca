package ntp

import (
	"context"
	"math"
	"strings"
	"sync"
	"time"
)

// Status is the clock's state for machined's GET /v1/status.
type Status struct {
	Synced   bool     `json:"synced"` // the clock has been set from NTP since boot
	Server   string   `json:"server"` // the server of the last sync's (median) sample
	OffsetMS float64  `json:"offset_ms"`
	DelayMS  float64  `json:"delay_ms"`
	Stratum  int      `json:"stratum"`
	LastSync string   `json:"last_sync"` // RFC 3339, or "" before the first sync
	Servers  []string `json:"servers"`
	Error    string   `json:"error"` // why the last poll failed; "" when it succeeded
}

// serverState is what a server told us about asking it.
type serverState struct {
	denied    bool          // DENY or RSTR: never ask again
	holdUntil time.Time     // RATE: not before this
	rateHold  time.Duration // the last RATE hold, doubled on each RATE in a row
}

// Syncer keeps the clock in sync with a changing list of NTP servers.
type Syncer struct {
	// Clock and Setter default to the system clock; replace them before Run (tests do,
	// so they never change the host's clock).
	Clock  Clock
	Setter ClockSetter

	say     func(string, ...interface{})
	timeout time.Duration // per query
	samples int           // queries per server per poll, once synced
	gap     time.Duration // between a server's queries in one poll

	mu      sync.Mutex
	servers []string
	state   map[string]*serverState
	status  Status
	synced  chan struct{} // closed at the first sync
	wake    chan struct{} // the server list changed
}

// New returns a Syncer for servers ("host" or "host:port"; port 123 by default) that
// reports on say (nil: silent). Run starts it.
func New(servers []string, say func(string, ...interface{})) *Syncer {
	if say == nil {
		say = func(string, ...interface{}) {}
	}
	return &Syncer{
		Clock:   systemClock{},
		Setter:  SystemSetter{},
		say:     say,
		timeout: defaultTimeout,
		samples: 3,
		gap:     2 * time.Second,
		servers: cleanServers(servers),
		state:   map[string]*serverState{},
		synced:  make(chan struct{}),
		wake:    make(chan struct{}, 1),
	}
}

// cleanServers trims the list and drops blanks and duplicates, keeping the order.
func cleanServers(servers []string) []string {
	out := []string{}
	seen := map[string]bool{}
	for _, s := range servers {
		s = strings.TrimSpace(s)
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// SetServers replaces the server list (from the machine config, the cloud platform or
// DHCP, any of which may change while running). A changed list is polled at once; what
// a remaining server said about being asked (DENY, RATE) is kept.
func (s *Syncer) SetServers(servers []string) {
	list := cleanServers(servers)
	s.mu.Lock()
	if equal(list, s.servers) {
		s.mu.Unlock()
		return
	}
	s.servers = list
	keep := map[string]bool{}
	for _, srv := range list {
		keep[srv] = true
	}
	for srv := range s.state {
		if !keep[srv] {
			delete(s.state, srv)
		}
	}
	s.mu.Unlock()
	s.say("ntp: servers %v", list)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Status returns a copy of the current state.
func (s *Syncer) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	st.Servers = append([]string{}, s.servers...)
	return st
}

// WaitSynced waits for the first sync, so boot can give NTP a bounded time before
// anything relies on the clock; false if ctx ends first.
func (s *Syncer) WaitSynced(ctx context.Context) bool {
	select {
	case <-s.synced:
		return true
	case <-ctx.Done():
		select {
		case <-s.synced:
			return true
		default:
			return false
		}
	}
}

func (s *Syncer) isSynced() bool {
	select {
	case <-s.synced:
		return true
	default:
		return false
	}
}

// fail records why a poll failed, saying so only when the reason changes.
func (s *Syncer) fail(msg string) {
	if s.setError(msg) {
		s.say("ntp: %s", msg)
	}
}

// refuse records that a correction was refused; say tells whether to say so (once per
// episode: the offset differs on every poll).
func (s *Syncer) refuse(why string, say bool) {
	s.setError(why)
	if say {
		s.say("ntp: %s", why)
	}
}

// setError records the status's error, telling whether it changed.
func (s *Syncer) setError(msg string) (changed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed = s.status.Error != msg
	s.status.Error = msg
	return changed
}

// succeed records a sync to sample c.
func (s *Syncer) succeed(c Sample, stepped bool) {
	s.mu.Lock()
	first := !s.status.Synced
	recovered := s.status.Error != ""
	s.status.Synced = true
	s.status.Server = c.Server
	s.status.OffsetMS = millis(c.Offset)
	s.status.DelayMS = millis(c.Delay)
	s.status.Stratum = c.Stratum
	s.status.LastSync = s.Clock.Now().UTC().Format(time.RFC3339)
	s.status.Error = ""
	if first {
		close(s.synced)
	}
	s.mu.Unlock()
	switch {
	case stepped:
		s.say("ntp: stepped the clock by %v (server %s, stratum %d, delay %v)", c.Offset, c.Server, c.Stratum, c.Delay)
	case first || recovered:
		s.say("ntp: in sync with %s (stratum %d, offset %v, delay %v)", c.Server, c.Stratum, c.Offset, c.Delay)
	}
}

// millis is d in milliseconds, to the microsecond.
func millis(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}
