package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit"
	"kiln/machined/internal/testkit/wait"
)

func TestServiceEnvironmentAndFiles(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "env.yaml"), []byte("command: /bin/sh\nargs: [-c, 'echo \"$GREETING from $0\"']\nenv: {GREETING: hi}\nrestart: never\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte(`{"command": "relative"}`), 0o644)
	os.WriteFile(filepath.Join(dir, "README"), []byte("not a service"), 0o644)
	specs, errs := loadServiceDir(dir)
	if len(specs) != 1 || specs[0].Name != "env" || len(errs) != 1 || !strings.Contains(errs[0].Error(), "bad.json") {
		t.Fatalf("specs %+v errs %v", specs, errs)
	}
	s, _ := testkit.Supervisor(t, t.TempDir(), specs...)
	wait.Until(t, "env to exit", 3*time.Second, func() bool { return testkit.ServiceStatus(s, "env").State == supervisor.StateExited })
	logs, _ := s.Logs("env")
	if !strings.Contains(strings.Join(logs, "\n"), "hi from /bin/sh") {
		t.Fatalf("logs: %v", logs)
	}
}

// An extension's service that crash-loops slowly (its file as an extension drops it; a real
// process that runs 3 s and exits 1, under the real supervisor): health, reading service/status,
// still names it when it looks between two crashes and sees it running, so a trial is never
// marked good while it loops.
func TestAnExtensionServiceCaughtRunningBetweenCrashesIsUnhealthy(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "agent.yaml"), []byte("command: /bin/sh\nargs: [-c, 'sleep 3; exit 1']\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	specs, errs := loadServiceDir(dir)
	if len(specs) != 1 || len(errs) != 0 {
		t.Fatalf("specs %+v errs %v", specs, errs)
	}
	s, _ := testkit.Supervisor(t, t.TempDir(), specs...)
	state := runObservers(t, &servicesObserver{read: s.Status})
	var seen supervisor.ServiceStatus
	wait.Until(t, "agent seen running again after a crash", 3*time.Second+observed, func() bool {
		got := observedServices(state)
		if len(got) == 1 {
			seen = got[0]
		}
		return seen.State == supervisor.StateRunning && seen.Restarts >= 1
	})
	problems := healthProblems(healthInputs{addresses: map[string][]string{"eth0": {"10.0.2.15/24"}}, services: []supervisor.ServiceStatus{seen}, now: time.Now()})
	if len(problems) != 1 || !strings.HasPrefix(problems[0], "service agent is restarting (") {
		t.Fatalf("health problems: %v", problems)
	}
}

// A failed upgrade's resume starts a new supervisor while the API lists services and reads
// their logs; under -race this shows the swap is guarded.
func TestSupervisorSwapWhileAPIReads(t *testing.T) {
	m := &machine{con: quietConsole(), cfg: &Config{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 50; i++ {
			_ = m.Services()
			_, _ = m.Logs("none")
		}
	}()
	for i := 0; i < 20; i++ {
		m.startServices(t.TempDir())
		m.currentSupervisor().Stop()
	}
	<-done
}
