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

// An upgrade's install stops the services and has the disk released; a failed upgrade gets
// /var back and the services started again, by a new supervisor, while the API lists services
// and reads their logs (under -race this shows the swap is guarded). The disk work itself (the
// unmount and the mount) is the e2e upgrade tests': this machine is not PID 1 and has none.
func TestServicesStopForAnUpgradeAndStartAgainWhileTheAPIReads(t *testing.T) {
	c := newConfigMachine(t, withExtensionService(t, "ext", "exec sleep 60"))
	c.startServices()
	t.Cleanup(func() { c.stopServices("test") })
	wait.Until(t, "ext running", 15*time.Second, func() bool { return serviceState(c.machine, "ext").State == supervisor.StateRunning })
	done := make(chan struct{})
	reading := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-reading:
				return
			default:
				_ = c.Services()
				_, _ = c.Logs("ext")
			}
		}
	}()
	for number := 1; number <= 3; number++ {
		pid := serviceState(c.machine, "ext").PID
		putUpgrade(t, c.machine, upgradeStatus{State: upgradePulling, Number: number, Slot: "B"})
		putUpgrade(t, c.machine, upgradeStatus{State: upgradeInstalling, Number: number, Slot: "B"})
		if err := c.awaitDiskReleased(number); err != nil {
			t.Fatalf("upgrade %d: %v", number, err)
		}
		if set := serviceSet(c.machine); set.State != setStopped || set.Reason != "an upgrade installing slot B" {
			t.Fatalf("upgrade %d: service/set while the disk is released: %+v", number, set)
		}
		if st := serviceState(c.machine, "ext"); st.State != supervisor.StateStopped {
			t.Fatalf("upgrade %d: ext while the disk is released: %+v", number, st)
		}
		putUpgrade(t, c.machine, upgradeStatus{State: upgradeFailed, Number: number, Slot: "B", Error: "test"})
		wait.Until(t, "ext running again", 15*time.Second, func() bool {
			st := serviceState(c.machine, "ext")
			return st.State == supervisor.StateRunning && st.PID != pid
		})
		if v := c.volume(); v.Released || v.ReleasedFor != 0 {
			t.Fatalf("upgrade %d failed: the disk should be back: %+v", number, v)
		}
	}
	close(reading)
	<-done
	if n := strings.Count(strings.Join(c.con.log.Lines(), "\n"), "services: started again"); n != 3 {
		t.Errorf("services started again %d times, not 3", n)
	}
}

// withExtensionService gives a config machine an extension whose service runs script.
func withExtensionService(t *testing.T, name, script string) func(m *machine) {
	dir := t.TempDir()
	spec := "name: " + name + "\ncommand: /bin/sh\nargs: [-c, " + script + "]\nrestart: always\n"
	if err := os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return func(m *machine) { m.extDirs.services = dir }
}

// putUpgrade puts upgrade/status as the upgrader does.
func putUpgrade(t *testing.T, m *machine, s upgradeStatus) {
	t.Helper()
	if _, err := m.resources.Put(upgradeOwner, upgradeType, upgradeID, &s); err != nil {
		t.Fatal(err)
	}
}

func serviceSet(m *machine) serviceSetSpec {
	res, _ := m.resources.Get(serviceSetType, serviceSetID)
	set, _ := resource.SpecOf[serviceSetSpec](res)
	return set
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
	c := newConfigMachine(t, withExtensionService(t, "ext", "exec sleep 60"))
	c.startServices()
	t.Cleanup(func() { c.stopServices("test") })
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
	c.startServices()
	t.Cleanup(func() { c.stopServices("test") })
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

// The services controller starts nothing until the boot says so, there is a config, the
// extensions' services are known (merged without them, the config's set would lack the
// extensions' services) and /var is set up; then one supervisor runs them all.
func TestTheServicesControllerWaitsForTheBootTheExtensionsAndVar(t *testing.T) {
	ext := supervisor.ServiceSpec{Name: "ext", Command: "/bin/sh", Args: []string{"-c", "exec sleep 60"}, Restart: "always"}
	state := resource.NewState()
	owners := map[resource.Type]string{machineConfigType: configOwner, extensionServicesType: "extensions", stageType: stageOwner, volumeType: "volumes"}
	for typ, owner := range owners {
		if err := state.Claim(typ, owner); err != nil {
			t.Fatal(err)
		}
	}
	m := &machine{con: quietConsole(), resources: state}
	runCounted(t, state, &servicesController{publish: m.setSupervisor, printf: t.Logf})
	t.Cleanup(func() {
		if sup := m.currentSupervisor(); sup != nil {
			sup.Stop()
		}
	})
	put := func(typ resource.Type, id string, spec interface{}) {
		t.Helper()
		if _, err := state.Put(owners[typ], typ, id, spec); err != nil {
			t.Fatal(err)
		}
	}
	waiting := func(why string) {
		t.Helper()
		wait.Until(t, "service/set waiting for "+why, 5*time.Second, func() bool {
			set := serviceSet(m)
			return set.State == setWaiting && set.Reason == why
		})
		if m.currentSupervisor() != nil {
			t.Fatalf("a supervisor while waiting for %s", why)
		}
	}
	waiting("the boot")
	put(stageType, stageID, stageSpec{Stage: stageStarting})
	waiting("the machine config")
	put(machineConfigType, machineConfigID, machineConfigSpec{})
	waiting("the extensions' services")
	put(extensionServicesType, extensionServicesID, extensionServicesSpec{Names: []string{"ext"}, Specs: []supervisor.ServiceSpec{ext}})
	waiting("/var")
	put(volumeType, volumeID, volumeSpec{Var: "tmpfs"})
	wait.Until(t, "ext running", 15*time.Second, func() bool { return serviceState(m, "ext").State == supervisor.StateRunning })
	if set := serviceSet(m); set.State != setRunning || set.ConfigVersion != 1 {
		t.Fatalf("service/set: %+v", set)
	}
	put(stageType, stageID, stageSpec{Stage: stageStopping, Action: actionPoweroff})
	wait.Until(t, "ext stopped", 15*time.Second, func() bool { return serviceState(m, "ext").State == supervisor.StateStopped })
	if set := serviceSet(m); set.State != setStopped || set.Reason != "the machine stops" {
		t.Fatalf("service/set once the machine stops: %+v", set)
	}
}
