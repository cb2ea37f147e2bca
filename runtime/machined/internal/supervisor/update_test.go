package supervisor_test

import (
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit/wait"
)

// Update, on real child processes: what changed is stopped, restarted or started, the rest runs on.

func running(s *supervisor.Supervisor, names ...string) func() bool {
	return func() bool {
		for _, name := range names {
			if status(s, name).State != supervisor.StateRunning {
				return false
			}
		}
		return true
	}
}

// valid is specs as machined hands them over: validated, their defaults filled in.
func valid(t *testing.T, specs ...supervisor.ServiceSpec) []supervisor.ServiceSpec {
	t.Helper()
	for i := range specs {
		if err := specs[i].Validate(); err != nil {
			t.Fatal(err)
		}
	}
	return specs
}

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

func TestUpdateTouchesOnlyWhatChanged(t *testing.T) {
	s, _ := testSupervisor(t,
		sh("kept", "exec sleep 60", supervisor.RestartAlways),
		sh("changed", "exec sleep 60", supervisor.RestartAlways),
		sh("gone", "exec sleep 60", supervisor.RestartAlways))
	wait.Until(t, "all three running", 3*time.Second, running(s, "kept", "changed", "gone"))
	kept, changed, gone := status(s, "kept").PID, status(s, "changed").PID, status(s, "gone").PID

	next := valid(t,
		sh("kept", "exec sleep 60", supervisor.RestartAlways),
		sh("changed", "exec sleep 61", supervisor.RestartAlways),
		sh("new", "exec sleep 60", supervisor.RestartAlways, "kept"))
	next[0].Source = "somewhere else" // where a service is defined is not how it runs
	got, err := s.Update(next)
	if err != nil {
		t.Fatal(err)
	}
	want := supervisor.Changes{Started: []string{"new"}, Restarted: []string{"changed"}, Stopped: []string{"gone"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("changes %+v, want %+v", got, want)
	}
	wait.Until(t, "changed and new running", 3*time.Second, running(s, "changed", "new"))
	if st := status(s, "kept"); st.PID != kept || st.State != supervisor.StateRunning {
		t.Fatalf("kept was touched: pid %d, now %+v", kept, st)
	}
	if st := status(s, "changed"); st.PID == changed || st.Restarts != 0 {
		t.Fatalf("changed should run anew (a fresh record): pid %d, now %+v", changed, st)
	}
	if alive(changed) || alive(gone) {
		t.Fatalf("a stopped process lives on: changed %v, gone %v", alive(changed), alive(gone))
	}
	if st := status(s, "gone"); st.Name != "" {
		t.Fatalf("gone is still listed: %+v", st)
	}
	if st := status(s, "kept"); st.Source != "somewhere else" {
		t.Fatalf("kept's source: %q", st.Source)
	}
	if again, err := s.Update(next); err != nil || !again.Empty() {
		t.Fatalf("the same set again: %+v, %v", again, err)
	}
}

func TestUpdateRefusesABadSetAndKeepsTheRunningOne(t *testing.T) {
	s, _ := testSupervisor(t, sh("a", "exec sleep 60", supervisor.RestartAlways))
	wait.Until(t, "a running", 3*time.Second, running(s, "a"))
	pid := status(s, "a").PID
	_, err := s.Update(valid(t, sh("b", "exec sleep 60", supervisor.RestartAlways, "nowhere")))
	if err == nil || !strings.Contains(err.Error(), `"nowhere"`) {
		t.Fatalf("an unknown dependency: %v", err)
	}
	if st := status(s, "a"); st.PID != pid || st.State != supervisor.StateRunning {
		t.Fatalf("a refused update changed a: %+v", st)
	}
}

func TestUpdateStopsAServiceInBackoffAtOnce(t *testing.T) {
	s, _ := testSupervisor(t, sh("crash", "exit 3", supervisor.RestartAlways))
	wait.Until(t, "crash restarting", 3*time.Second, func() bool { return status(s, "crash").Restarts >= 3 })
	began := time.Now()
	if _, err := s.Update(nil); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > time.Second {
		t.Fatalf("removing a service in backoff took %s", took)
	}
	if len(s.Status()) != 0 {
		t.Fatalf("services left: %+v", s.Status())
	}
}

func TestUpdateKillsAServiceThatIgnoresTERM(t *testing.T) {
	s, _ := testSupervisor(t, sh("stubborn", "trap '' TERM; echo ignoring TERM; while :; do sleep 0.05; done", supervisor.RestartAlways))
	wait.Until(t, "stubborn ignoring TERM", 3*time.Second, func() bool {
		lines, _ := s.Logs("stubborn")
		return status(s, "stubborn").State == supervisor.StateRunning && strings.Contains(strings.Join(lines, "\n"), "ignoring TERM")
	})
	pid := status(s, "stubborn").PID
	if _, err := s.Update(nil); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Fatalf("pid %d outlived its removal", pid)
	}
}

func TestUpdateAfterStopIsRefused(t *testing.T) {
	s, _ := testSupervisor(t, sh("a", "exec sleep 60", supervisor.RestartAlways))
	s.Stop()
	if _, err := s.Update(valid(t, sh("b", "exec sleep 60", supervisor.RestartAlways))); !errors.Is(err, supervisor.ErrStopped) {
		t.Fatalf("update after stop: %v", err)
	}
	if st := status(s, "b"); st.Name != "" {
		t.Fatalf("b started on a stopped supervisor: %+v", st)
	}
}
