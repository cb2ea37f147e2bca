// Package supervisor runs machined's services and every other child process machined
// starts: service states, restarts with backoff, dependencies between services, their logs,
// and the process-wide reaper that owns wait4(-1).
package supervisor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"syscall"
	"time"

	"kiln/machined/internal/safego"
)

// Service states, as the API reports them.
const (
	StateWaiting = "waiting" // for the services it starts after
	StateRunning = "running" // started, not exited
	StateBackoff = "backoff" // exited or failed to start; restarting after a delay
	StateExited  = "exited"  // exited 0 and will not restart
	StateFailed  = "failed"  // failed and will not restart (policy never, or on-failure ran out)
	StateStopped = "stopped" // stopped by machined (shutdown)
)

// Options tunes a Supervisor; DefaultOptions are machined's.
type Options struct {
	LogDir      string        // per-service <name>.log files; "" keeps logs in memory only
	BackoffBase time.Duration // first restart delay, doubled per consecutive failure
	BackoffMax  time.Duration
	ResetAfter  time.Duration // a run at least this long forgets earlier failures
	StopTimeout time.Duration // SIGTERM, then SIGKILL after this
	Events      func(string)  // one line per start, exit and restart (the console)
}

// DefaultOptions are the restart and stop timings machined runs with.
func DefaultOptions() Options {
	return Options{BackoffBase: time.Second, BackoffMax: 30 * time.Second,
		ResetAfter: 30 * time.Second, StopTimeout: 10 * time.Second}
}

// ServiceStatus is one service's state as /v1/services reports it.
type ServiceStatus struct {
	Name     string    `json:"name"`
	State    string    `json:"state"`
	PID      int       `json:"pid,omitempty"`
	Restarts int       `json:"restarts"`
	LastExit string    `json:"last_exit,omitempty"`
	Since    time.Time `json:"since"`
	Type     string    `json:"type"`
	Restart  string    `json:"restart"`
	After    []string  `json:"after,omitempty"`
	Source   string    `json:"source,omitempty"`
	Waiting  []string  `json:"waiting_for,omitempty"`
}

type service struct {
	spec     ServiceSpec
	state    string
	pid      int
	restarts int
	lastExit string
	exitOK   bool
	since    time.Time
	log      *RingLog
	file     *os.File
	quitting bool          // Update stops this service alone (removed or changed); under s.mu
	quit     chan struct{} // closed with quitting: ends its backoff and dependency waits
	done     chan struct{} // closed when its supervise goroutine returns
}

// Supervisor starts, restarts and stops a set of services.
type Supervisor struct {
	opts     Options
	updateMu sync.Mutex // one Update at a time
	mu       sync.Mutex
	services map[string]*service
	changed  chan struct{} // closed and replaced on every state change
	stopping bool
	wake     chan struct{} // closed on stop: ends backoff and dependency waits
	wg       sync.WaitGroup
}

// New returns a supervisor with no services; Start gives it its set.
func New(opts Options) *Supervisor {
	return &Supervisor{opts: opts, services: map[string]*service{}, changed: make(chan struct{}), wake: make(chan struct{})}
}

// Start validates the set (unknown dependencies, cycles) and starts every service, each
// once the services it starts after are running (simple) or have exited 0 (oneshot).
func (s *Supervisor) Start(specs []ServiceSpec) error {
	if err := checkDependencies(specs); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.launch(specs)
	return nil
}

// launch adds the services and starts their goroutines. Callers hold s.mu.
func (s *Supervisor) launch(specs []ServiceSpec) {
	for _, spec := range specs {
		svc := &service{spec: spec, state: StateWaiting, since: time.Now(), log: NewRingLog(1000, 256<<10),
			quit: make(chan struct{}), done: make(chan struct{})}
		if s.opts.LogDir != "" {
			path := filepath.Join(s.opts.LogDir, spec.Name+".log")
			if f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_CLOEXEC, 0o640); err == nil {
				svc.file = f
			} else {
				s.event("service %s: log file: %v (logs kept in memory only)", spec.Name, err)
			}
		}
		s.services[spec.Name] = svc
	}
	for _, spec := range specs {
		s.wg.Add(1)
		svc := s.services[spec.Name]
		safego.Go("service "+spec.Name, func() { s.supervise(svc) })
	}
	s.broadcast() // a service waiting on a name just added looks again
}

// Changes is what an Update did, by service name.
type Changes struct {
	Started   []string `json:"started,omitempty"`   // new services
	Restarted []string `json:"restarted,omitempty"` // services whose spec changed
	Stopped   []string `json:"stopped,omitempty"`   // services no longer in the set
}

// Empty says whether the update changed nothing.
func (c Changes) Empty() bool { return len(c.Started)+len(c.Restarted)+len(c.Stopped) == 0 }

// ErrStopped is Update's answer once Stop has begun: the supervisor takes no new services.
var ErrStopped = errors.New("the services are stopped")

// Update makes the running set `specs`: a service whose name is gone is stopped, one whose spec
// changed is stopped and started again, a new one is started, and the others run on untouched.
// The set is validated first, as Start's is; on an error nothing changes.
func (s *Supervisor) Update(specs []ServiceSpec) (Changes, error) {
	var changes Changes
	if err := checkDependencies(specs); err != nil {
		return changes, err
	}
	s.updateMu.Lock()
	defer s.updateMu.Unlock()
	want := map[string]ServiceSpec{}
	for _, spec := range specs {
		want[spec.Name] = spec
	}
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return changes, ErrStopped
	}
	var stop []*service
	for name, svc := range s.services {
		if spec, kept := want[name]; !kept {
			stop = append(stop, svc)
			changes.Stopped = append(changes.Stopped, name)
		} else if !sameRun(spec, svc.spec) {
			stop = append(stop, svc)
			changes.Restarted = append(changes.Restarted, name)
		} else {
			svc.spec.Source = spec.Source // defined elsewhere now, run the same: it runs on
		}
	}
	var start []ServiceSpec
	for _, spec := range specs {
		if svc, ok := s.services[spec.Name]; !ok || !sameRun(spec, svc.spec) {
			start = append(start, spec)
			if !ok {
				changes.Started = append(changes.Started, spec.Name)
			}
		}
	}
	for _, svc := range stop {
		svc.quitting = true
		close(svc.quit)
		if svc.pid > 0 {
			_ = syscall.Kill(-svc.pid, syscall.SIGTERM)
		}
	}
	s.mu.Unlock()
	for _, svc := range stop {
		s.awaitStop(svc)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, svc := range stop {
		delete(s.services, svc.spec.Name)
	}
	if !s.stopping { // Stop may have begun meanwhile: it takes nothing new
		s.launch(start)
	}
	sort.Strings(changes.Started)
	sort.Strings(changes.Restarted)
	sort.Strings(changes.Stopped)
	return changes, nil
}

// sameRun says whether two specs run the same service: all but where it was defined.
func sameRun(a, b ServiceSpec) bool {
	a.Source, b.Source = "", ""
	return reflect.DeepEqual(a, b)
}

// awaitStop waits for a service Update is stopping to end: SIGKILL after the stop timeout.
func (s *Supervisor) awaitStop(svc *service) {
	select {
	case <-svc.done:
	case <-time.After(s.opts.StopTimeout):
		s.mu.Lock()
		if svc.pid > 0 {
			_ = syscall.Kill(-svc.pid, syscall.SIGKILL)
		}
		s.mu.Unlock()
		<-svc.done
	}
	s.mu.Lock()
	if svc.file != nil {
		svc.file.Close()
		svc.file = nil
	}
	s.mu.Unlock()
}

func (s *Supervisor) event(format string, args ...interface{}) {
	if s.opts.Events != nil {
		s.opts.Events(fmt.Sprintf(format, args...))
	}
}

// setState records a change and wakes everyone waiting on one. Callers hold s.mu.
func (s *Supervisor) setState(svc *service, state string) {
	svc.state = state
	svc.since = time.Now()
	s.broadcast()
}

// broadcast wakes everyone waiting on a change. Callers hold s.mu.
func (s *Supervisor) broadcast() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// note writes one of machined's own lines into the service's log, so its history reads whole.
func (svc *service) note(format string, args ...interface{}) {
	line := fmt.Sprintf("[machined %s] %s\n", time.Now().UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
	svc.log.Write([]byte(line))
	if svc.file != nil {
		_, _ = svc.file.WriteString(line)
	}
}

// pending lists the dependencies that are not yet satisfied. Callers hold s.mu.
func (s *Supervisor) pending(svc *service) []string {
	var out []string
	for _, name := range svc.spec.After {
		dep := s.services[name]
		done := dep.state == StateExited && dep.exitOK
		if !done && (dep.spec.Type == TypeOneshot || dep.state != StateRunning) {
			out = append(out, name)
		}
	}
	return out
}

func (s *Supervisor) supervise(svc *service) {
	defer s.wg.Done()
	defer close(svc.done)
	// Wait for dependencies.
	for {
		s.mu.Lock()
		if s.stopping || svc.quitting {
			s.setState(svc, StateStopped)
			s.mu.Unlock()
			return
		}
		if len(s.pending(svc)) == 0 {
			s.mu.Unlock()
			break
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-s.wake:
		case <-svc.quit:
		}
	}
	failures := 0
	for {
		began := time.Now()
		status, err := s.runOnce(svc)
		s.mu.Lock()
		if s.stopping || svc.quitting {
			s.setState(svc, StateStopped)
			s.mu.Unlock()
			return
		}
		ok := err == nil && status.Exited() && status.ExitStatus() == 0
		if err != nil {
			svc.lastExit = "start failed: " + err.Error()
		} else {
			svc.lastExit = DescribeExit(status)
		}
		svc.exitOK, svc.pid = ok, 0
		restart := svc.spec.Restart == RestartAlways || (svc.spec.Restart == RestartOnFailure && !ok)
		if !restart {
			if ok {
				s.setState(svc, StateExited)
			} else {
				s.setState(svc, StateFailed)
			}
			svc.note("%s; not restarting (restart: %s)", svc.lastExit, svc.spec.Restart)
			s.event("service %s: %s; not restarting (restart: %s)", svc.spec.Name, svc.lastExit, svc.spec.Restart)
			s.mu.Unlock()
			return
		}
		if time.Since(began) >= s.opts.ResetAfter {
			failures = 0
		}
		failures++
		delay := backoff(s.opts.BackoffBase, s.opts.BackoffMax, failures)
		s.setState(svc, StateBackoff)
		svc.note("%s; restarting in %s", svc.lastExit, delay)
		s.event("service %s: %s; restarting in %s", svc.spec.Name, svc.lastExit, delay)
		s.mu.Unlock()
		select {
		case <-time.After(delay):
		case <-s.wake:
		case <-svc.quit:
		}
		s.mu.Lock()
		if !s.stopping && !svc.quitting {
			svc.restarts++
		}
		s.mu.Unlock()
	}
}

// backoff is base*2^(n-1), capped: 1 s, 2 s, 4 s ... 30 s with the defaults.
func backoff(base, max time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}

// runOnce starts the service and waits for it to exit.
func (s *Supervisor) runOnce(svc *service) (syscall.WaitStatus, error) {
	cmd := &exec.Cmd{
		Path: svc.spec.Command,
		Args: append([]string{svc.spec.Command}, svc.spec.Args...),
		Env:  append(BaseEnv(), envList(svc.spec.Env)...),
		Dir:  "/",
		// its own process group, so stopping it reaches the children it forked too
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	s.mu.Lock()
	if s.stopping || svc.quitting {
		s.mu.Unlock()
		return 0, fmt.Errorf("stopping")
	}
	out, done, err := Children().StartPiped(cmd)
	if err != nil {
		s.mu.Unlock()
		return 0, err
	}
	svc.pid = cmd.Process.Pid
	s.setState(svc, StateRunning)
	svc.note("started pid %d", svc.pid)
	s.event("service %s: started (pid %d)", svc.spec.Name, svc.pid)
	file := svc.file // taken under s.mu: Stop clears it while the output may still be draining
	s.mu.Unlock()
	safego.Go("service "+svc.spec.Name+" output", func() { svc.collect(out, file) })
	return <-done, nil
}

// collect copies the service's output into its ring buffer and log file (nil for none) until EOF.
func (svc *service) collect(out io.ReadCloser, file *os.File) {
	defer out.Close()
	var w io.Writer = svc.log
	if file != nil {
		w = io.MultiWriter(svc.log, file)
	}
	_, _ = io.Copy(w, out)
}

func envList(env StringMap) []string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

// Stop stops every service: SIGTERM to each process group, SIGKILL after the timeout.
func (s *Supervisor) Stop() {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return
	}
	s.stopping = true
	close(s.wake)
	s.signalAll(syscall.SIGTERM)
	s.mu.Unlock()
	done := make(chan struct{})
	safego.Go("supervisor stop", func() { s.wg.Wait(); close(done) })
	select {
	case <-done:
	case <-time.After(s.opts.StopTimeout):
		s.mu.Lock()
		s.signalAll(syscall.SIGKILL)
		s.mu.Unlock()
		<-done
	}
	s.mu.Lock()
	for _, svc := range s.services {
		if svc.file != nil {
			svc.file.Close()
			svc.file = nil
		}
	}
	s.mu.Unlock()
}

func (s *Supervisor) signalAll(sig syscall.Signal) {
	for _, svc := range s.services {
		if svc.pid > 0 {
			_ = syscall.Kill(-svc.pid, sig)
		}
	}
}

// Status lists every service, by name.
func (s *Supervisor) Status() []ServiceStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ServiceStatus, 0, len(s.services))
	for _, svc := range s.services {
		st := ServiceStatus{Name: svc.spec.Name, State: svc.state, PID: svc.pid, Restarts: svc.restarts,
			LastExit: svc.lastExit, Since: svc.since, Type: svc.spec.Type, Restart: svc.spec.Restart, After: svc.spec.After, Source: svc.spec.Source}
		if svc.state == StateWaiting {
			st.Waiting = s.pending(svc)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Logs returns a service's kept log lines; ok is false for an unknown service.
func (s *Supervisor) Logs(name string) ([]string, bool) {
	s.mu.Lock()
	svc := s.services[name]
	s.mu.Unlock()
	if svc == nil {
		return nil, false
	}
	return svc.log.Lines(), true
}
