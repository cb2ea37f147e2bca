package supervisor_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit"
	"kiln/machined/internal/testkit/wait"
)

// Real child processes (/bin/sh) under the real reaper: fast backoff settings keep it short.

// testSupervisor is testkit.Supervisor logging to a temporary directory.
func testSupervisor(t *testing.T, specs ...supervisor.ServiceSpec) (*supervisor.Supervisor, *testkit.Lines) {
	t.Helper()
	return testkit.Supervisor(t, t.TempDir(), specs...)
}

func sh(name, script string, restart string, after ...string) supervisor.ServiceSpec {
	return supervisor.ServiceSpec{Name: name, Command: "/bin/sh", Args: []string{"-c", script}, Restart: restart, After: after}
}

func oneshot(s supervisor.ServiceSpec) supervisor.ServiceSpec {
	s.Type = supervisor.TypeOneshot
	return s
}

var status = testkit.ServiceStatus

func TestRestartWithExponentialBackoff(t *testing.T) {
	logDir := t.TempDir()
	s, events := testkit.Supervisor(t, logDir, sh("crash", "echo attempt; exit 3", supervisor.RestartOnFailure))
	wait.Until(t, "five restarts", 5*time.Second, func() bool { return status(s, "crash").Restarts >= 5 })
	var delays []string
	for _, e := range events.All() {
		if i := strings.Index(e, "restarting in "); i >= 0 {
			delays = append(delays, e[i+len("restarting in "):])
		}
	}
	want := []string{"50ms", "100ms", "200ms", "200ms", "200ms"}
	if len(delays) < len(want) || strings.Join(delays[:5], " ") != strings.Join(want, " ") {
		t.Fatalf("backoff delays %v, want %v first", delays, want)
	}
	if st := status(s, "crash"); st.LastExit != "exit status 3" {
		t.Fatalf("last exit %q", st.LastExit)
	}
	logs, _ := s.Logs("crash")
	if n := strings.Count(strings.Join(logs, "\n"), "attempt"); n < 5 {
		t.Fatalf("ring buffer kept %d attempts:\n%s", n, strings.Join(logs, "\n"))
	}
	data, err := os.ReadFile(filepath.Join(logDir, "crash.log"))
	if err != nil || strings.Count(string(data), "attempt") < 5 {
		t.Fatalf("crash.log: %v\n%s", err, data)
	}
}

func TestRestartPolicies(t *testing.T) {
	s, _ := testSupervisor(t,
		sh("done", "exit 0", supervisor.RestartOnFailure),
		sh("fail-never", "exit 1", supervisor.RestartNever),
		sh("always", "exit 0", supervisor.RestartAlways),
		supervisor.ServiceSpec{Name: "missing", Command: "/nonexistent/binary", Restart: supervisor.RestartNever})
	wait.Until(t, "done to exit", 3*time.Second, func() bool { return status(s, "done").State == supervisor.StateExited })
	wait.Until(t, "fail-never to fail", 3*time.Second, func() bool { return status(s, "fail-never").State == supervisor.StateFailed })
	wait.Until(t, "missing to fail", 3*time.Second, func() bool { return status(s, "missing").State == supervisor.StateFailed })
	wait.Until(t, "always to restart", 3*time.Second, func() bool { return status(s, "always").Restarts >= 2 })
	if st := status(s, "done"); st.Restarts != 0 {
		t.Fatalf("on-failure restarted a clean exit: %+v", st)
	}
	if st := status(s, "missing"); !strings.HasPrefix(st.LastExit, "start failed") {
		t.Fatalf("missing binary: %+v", st)
	}
}

func TestKilledServiceRestarts(t *testing.T) {
	s, _ := testSupervisor(t, sh("daemon", "exec sleep 60", supervisor.RestartAlways))
	wait.Until(t, "daemon running", 3*time.Second, func() bool { return status(s, "daemon").State == supervisor.StateRunning })
	first := status(s, "daemon").PID
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "a new pid", 3*time.Second, func() bool {
		st := status(s, "daemon")
		return st.State == supervisor.StateRunning && st.PID != first && st.PID != 0
	})
	if st := status(s, "daemon"); st.Restarts != 1 || st.LastExit != "killed by killed" {
		t.Fatalf("after kill: %+v", st)
	}
}

func TestDependenciesStartInOrder(t *testing.T) {
	dir := t.TempDir()
	// db starts only once its own dependency (setup, a one-shot) has exited successfully;
	// web starts after db is running; stuck waits for a one-shot that failed for good (a simple
	// service counts as started while it runs, so a failing simple one would race with stuck).
	s, events := testSupervisor(t,
		sh("web", "exec sleep 60", supervisor.RestartAlways, "db"),
		sh("db", "test -f "+dir+"/setup-done && exec sleep 60", supervisor.RestartNever, "setup"),
		oneshot(sh("setup", "sleep 0.3; touch "+dir+"/setup-done", supervisor.RestartNever)),
		oneshot(sh("broken", "exit 1", supervisor.RestartNever)),
		sh("stuck", "exec sleep 60", supervisor.RestartAlways, "broken"))
	wait.Until(t, "web running", 5*time.Second, func() bool { return status(s, "web").State == supervisor.StateRunning })
	if st := status(s, "db"); st.State != supervisor.StateRunning {
		t.Fatalf("db should be running (setup had finished first): %+v", st)
	}
	order := []string{}
	for _, e := range events.All() {
		if strings.Contains(e, ": started") {
			order = append(order, strings.Fields(e)[1])
		}
	}
	pos := map[string]int{}
	for i, name := range order {
		pos[strings.TrimSuffix(name, ":")] = i
	}
	if !(pos["setup"] < pos["db"] && pos["db"] < pos["web"]) {
		t.Fatalf("start order %v", order)
	}
	wait.Until(t, "broken to fail", 3*time.Second, func() bool { return status(s, "broken").State == supervisor.StateFailed })
	time.Sleep(200 * time.Millisecond)
	if st := status(s, "stuck"); st.State != supervisor.StateWaiting || strings.Join(st.Waiting, ",") != "broken" {
		t.Fatalf("stuck should wait for broken: %+v", st)
	}
}

func TestStopEscalatesToSIGKILL(t *testing.T) {
	s, _ := testSupervisor(t,
		sh("polite", "exec sleep 60", supervisor.RestartAlways),
		sh("stubborn", "trap '' TERM; echo ignoring TERM; while :; do sleep 0.05; done", supervisor.RestartAlways))
	// running is not enough: on a loaded machine the shell may not have set its trap yet, and
	// then SIGTERM ends it at once
	wait.Until(t, "both running, stubborn ignoring TERM", 3*time.Second, func() bool {
		lines, _ := s.Logs("stubborn")
		return status(s, "polite").State == supervisor.StateRunning && status(s, "stubborn").State == supervisor.StateRunning &&
			strings.Contains(strings.Join(lines, "\n"), "ignoring TERM")
	})
	pids := []int{status(s, "polite").PID, status(s, "stubborn").PID}
	began := time.Now()
	s.Stop()
	took := time.Since(began)
	if took < 400*time.Millisecond || took > 3*time.Second {
		t.Fatalf("stop took %s; want the 500ms SIGKILL escalation", took)
	}
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			t.Fatalf("pid %d still alive after Stop", pid)
		}
	}
	for _, name := range []string{"polite", "stubborn"} {
		if st := status(s, name); st.State != supervisor.StateStopped {
			t.Fatalf("%s: %+v", name, st)
		}
	}
}

func TestRunCommandsThroughTheReaper(t *testing.T) {
	out, err := supervisor.Run("/bin/sh", "-c", "echo out; echo err >&2")
	if err != nil || out != "out\nerr\n" {
		t.Fatalf("%q %v", out, err)
	}
	out, err = supervisor.RunInput([]byte("piped\n"), "/bin/cat")
	if err != nil || out != "piped\n" {
		t.Fatalf("%q %v", out, err)
	}
	if _, err := supervisor.Run("/bin/sh", "-c", "echo first; echo why it failed; exit 4"); err == nil || err.Error() != "/bin/sh: exit status 4: why it failed" {
		t.Fatalf("failure: %v", err)
	}
}

func TestRingLogBounds(t *testing.T) {
	r := supervisor.NewRingLog(3, 1000)
	r.Write([]byte("a\nb\nc\nd\npartial"))
	if got := strings.Join(r.Lines(), ","); got != "b,c,d,partial" {
		t.Fatalf("lines: %s", got)
	}
	r = supervisor.NewRingLog(100, 10)
	r.Write([]byte("12345\n67890\nabcde\n"))
	if got := strings.Join(r.Lines(), ","); got != "67890,abcde" {
		t.Fatalf("byte bound: %s", got)
	}
}
