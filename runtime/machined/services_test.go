package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/resource"
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

// The services section applied live, on real processes: newConfigMachine's controllers, and a
// supervisor started as the boot starts it (an extension's service from a directory, the booted
// config's web, whose /bin/web does not exist and so keeps failing).

// withServices is bootedConfig with its services section replaced by services (YAML list items).
func withServices(services ...string) string {
	head := bootedConfig[:strings.Index(bootedConfig, "services:")]
	if len(services) == 0 {
		return head + "services: []\n"
	}
	return head + "services:\n  - " + strings.Join(services, "\n  - ") + "\n"
}

func serviceState(m *machine, name string) supervisor.ServiceStatus {
	for _, s := range m.Services() {
		if s.Name == name {
			return s
		}
	}
	return supervisor.ServiceStatus{}
}

func TestAppliedServicesStartRestartAndStopWithoutTouchingTheOthers(t *testing.T) {
	extensions := t.TempDir()
	ext := "name: ext\ncommand: /bin/sh\nargs: [-c, exec sleep 60]\nrestart: always\n"
	if err := os.WriteFile(filepath.Join(extensions, "ext.yaml"), []byte(ext), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newConfigMachine(t, func(m *machine) { m.extDirs.services = extensions })
	if err := c.superviseServices(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.currentSupervisor().Stop() })
	wait.Until(t, "ext running", 15*time.Second, func() bool { return serviceState(c.machine, "ext").State == supervisor.StateRunning })
	extPID := serviceState(c.machine, "ext").PID

	web := "{name: web, command: /bin/sh, args: [-c, exec sleep 60], restart: always}"
	code, report, msg := c.post(t, "admin", "", withServices(web, "{name: side, command: /bin/sh, args: [-c, exec sleep 61], after: [web]}"))
	if code != http.StatusOK || sectionOf(report, "services").Result != sectionApplied {
		t.Fatalf("%d %s: %+v", code, msg, report)
	}
	wait.Until(t, "web and side running", 15*time.Second, func() bool {
		return serviceState(c.machine, "web").State == supervisor.StateRunning && serviceState(c.machine, "side").State == supervisor.StateRunning
	})
	if st := serviceState(c.machine, "web"); st.Source != "machine config" || st.Restarts != 0 {
		t.Errorf("web runs anew from the applied config: %+v", st)
	}
	if st := serviceState(c.machine, "ext"); st.PID != extPID {
		t.Errorf("the extension's service was restarted: pid %d, now %+v", extPID, st)
	}
	webPID := serviceState(c.machine, "web").PID

	code, report, msg = c.post(t, "admin", "", withServices(web))
	if code != http.StatusOK || sectionOf(report, "services").Result != sectionApplied {
		t.Fatalf("%d %s: %+v", code, msg, report)
	}
	wait.Until(t, "side gone", 15*time.Second, func() bool { return serviceState(c.machine, "side").Name == "" })
	if web, ext := serviceState(c.machine, "web"), serviceState(c.machine, "ext"); web.PID != webPID || ext.PID != extPID {
		t.Errorf("removing side touched the others: web %+v, ext %+v", web, ext)
	}
	if got := c.runningConfig().Services; len(got) != 1 || got[0].Name != "web" {
		t.Errorf("running config's services: %+v", got)
	}
}

func TestAnAppliedServiceSetWithAnUnknownDependencyKeepsWhatRuns(t *testing.T) {
	c := newConfigMachine(t)
	if err := c.superviseServices(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.currentSupervisor().Stop() })
	code, _, msg := c.post(t, "admin", "", withServices("{name: lone, command: /bin/sh, args: [-c, exec sleep 60], after: [nowhere]}"))
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, msg)
	}
	wait.Until(t, "the refusal on the console", 15*time.Second, func() bool {
		return strings.Contains(strings.Join(c.con.log.Lines(), "\n"), `starts after "nowhere", which is not defined; the running services are kept`)
	})
	if st := serviceState(c.machine, "web"); st.Name != "web" {
		t.Errorf("web (booted) should still be there: %+v", c.Services())
	}
}

// The services controller leaves a supervisor alone until extension/services is there: merged
// with no extensions' services, the config's set would stop the extensions' running ones.
func TestTheServicesControllerWaitsForTheExtensionsServices(t *testing.T) {
	ext := supervisor.ServiceSpec{Name: "ext", Command: "/bin/sh", Args: []string{"-c", "exec sleep 60"}, Restart: "always"}
	sup := supervisor.New(supervisor.DefaultOptions())
	if err := sup.Start([]supervisor.ServiceSpec{ext}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sup.Stop)
	m := &machine{con: quietConsole(), sup: sup}
	wait.Until(t, "ext running", 15*time.Second, func() bool { return serviceState(m, "ext").State == supervisor.StateRunning })
	pid := serviceState(m, "ext").PID

	state := resource.NewState()
	for typ, owner := range map[resource.Type]string{machineConfigType: configOwner, extensionServicesType: "extensions"} {
		if err := state.Claim(typ, owner); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := state.Put(configOwner, machineConfigType, machineConfigID, machineConfigSpec{}); err != nil {
		t.Fatal(err)
	}
	ctrl := runCounted(t, state, &servicesController{current: m.currentSupervisor, printf: t.Logf})
	wait.Until(t, "the controller's run without extension/services", 5*time.Second, func() bool { return ctrl.count() >= 1 })
	if st := serviceState(m, "ext"); st.PID != pid || st.State != supervisor.StateRunning {
		t.Fatalf("the extension's service was touched before its spec was known: %+v", st)
	}
	runs := ctrl.count()
	spec := extensionServicesSpec{Names: []string{"ext"}, Specs: []supervisor.ServiceSpec{ext}}
	if _, err := state.Put("extensions", extensionServicesType, extensionServicesID, spec); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the controller's run with extension/services", 5*time.Second, func() bool { return ctrl.count() > runs })
	if st := serviceState(m, "ext"); st.PID != pid || st.State != supervisor.StateRunning {
		t.Fatalf("the extension's service, unchanged, was restarted or stopped: %+v", st)
	}
}
