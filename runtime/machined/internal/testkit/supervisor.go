package testkit

import (
	"testing"
	"time"

	"kiln/machined/internal/supervisor"
)

// Supervisor runs specs (validated first) under a supervisor with fast backoff settings, so
// that tests with real children under the real reaper stay short, writing the services' logs
// to logDir; it returns the supervisor, stopped when the test ends, and its event lines.
func Supervisor(t testing.TB, logDir string, specs ...supervisor.ServiceSpec) (*supervisor.Supervisor, *Lines) {
	t.Helper()
	events := &Lines{}
	s := supervisor.New(supervisor.Options{LogDir: logDir, BackoffBase: 50 * time.Millisecond,
		BackoffMax: 200 * time.Millisecond, ResetAfter: 5 * time.Second, StopTimeout: 500 * time.Millisecond,
		Events: func(line string) { events.Add("%s", line) }})
	for i := range specs {
		if err := specs[i].Validate(); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(specs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s, events
}

// ServiceStatus is the status s gives for the service name; zero when it has none.
func ServiceStatus(s *supervisor.Supervisor, name string) supervisor.ServiceStatus {
	for _, st := range s.Status() {
		if st.Name == name {
			return st
		}
	}
	return supervisor.ServiceStatus{}
}
