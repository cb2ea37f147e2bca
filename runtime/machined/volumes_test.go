package main

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/machined/internal/resource"
	"kiln/machined/internal/testkit"
	"kiln/machined/internal/testkit/wait"
)

// withVolume gives m the volume/status the volumes controller puts at boot.
func withVolume(t *testing.T, m *machine, v volumeSpec) *machine {
	t.Helper()
	if m.resources == nil {
		m.resources = resource.NewState()
	}
	if err := m.resources.Claim(volumeType, "volumes"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.resources.Put("volumes", volumeType, volumeID, v); err != nil {
		t.Fatal(err)
	}
	return m
}

// setupRecorder stands in for the disk work (setupVolumes formats and mounts real disks, which
// the e2e boots exercise): it records each install section it is given.
type setupRecorder struct {
	mu    sync.Mutex
	calls []installSpec
}

func (s *setupRecorder) setup(install installSpec) volumeSpec {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, install)
	return volumeSpec{Disk: "/dev/vda", Var: "/dev/vda6", State: "/dev/vda5"}
}

// countedRuns wraps a controller to count its finished runs: how a test knows the controller
// has seen a change it must do nothing about.
type countedRuns struct {
	resource.Controller
	mu   sync.Mutex
	runs int
}

func (c *countedRuns) Reconcile(ctx context.Context, r *resource.Run) error {
	err := c.Controller.Reconcile(ctx, r)
	c.mu.Lock()
	c.runs++
	c.mu.Unlock()
	return err
}

// Every keeps a periodic controller periodic under the count (0, not periodic, otherwise).
func (c *countedRuns) Every() time.Duration {
	if p, ok := c.Controller.(resource.Periodic); ok {
		return p.Every()
	}
	return 0
}

func (c *countedRuns) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs
}

// runCounted runs c alone over state until the test ends, counting its runs.
func runCounted(t *testing.T, state *resource.State, c resource.Controller) *countedRuns {
	t.Helper()
	counted := &countedRuns{Controller: c}
	rt := resource.NewRuntime(state, t.Logf)
	if err := rt.Register(counted); err != nil {
		t.Fatal(err)
	}
	testkit.RunUntilStopped(t, 5*time.Second, rt.Run)
	return counted
}

func (s *setupRecorder) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

// The disks are set up once, from the first install section the boot puts, and only then is
// there a volume/status; an install section that changes later (a kept config's) changes nothing
// until the next boot.
func TestVolumesAreSetUpOnceFromTheFirstInstallSection(t *testing.T) {
	state := resource.NewState()
	if err := state.Claim(installConfigType, configOwner); err != nil {
		t.Fatal(err)
	}
	rec := &setupRecorder{}
	ctrl := runCounted(t, state, &volumesController{setup: rec.setup})

	wait.Until(t, "the controller's first run", 5*time.Second, func() bool { return ctrl.count() >= 1 })
	if _, ok := state.Get(volumeType, volumeID); ok || rec.count() != 0 {
		t.Fatalf("disks set up before the boot said which: %d calls", rec.count())
	}
	first := installSpec{Disk: "/dev/vda", Filesystem: "xfs", Param: "/dev/vdb"}
	if _, err := state.Put(configOwner, installConfigType, installConfigID, first); err != nil {
		t.Fatal(err)
	}
	m := &machine{resources: state}
	want := volumeSpec{Disk: "/dev/vda", Var: "/dev/vda6", State: "/dev/vda5"}
	if got := m.awaitVolumes(); got != want {
		t.Fatalf("volume/status: %+v", got)
	}
	wait.Until(t, "the run that set the disks up", 5*time.Second, func() bool { return ctrl.count() >= 2 })
	res, _ := state.Get(volumeType, volumeID)
	runs := ctrl.count()
	if _, err := state.Put(configOwner, installConfigType, installConfigID, installSpec{Disk: "/dev/vdc"}); err != nil {
		t.Fatal(err)
	}
	// the controller runs again for the change; it must keep the disks and the resource as they are
	wait.Until(t, "the controller's run for the new section", 5*time.Second, func() bool { return ctrl.count() > runs })
	again, _ := state.Get(volumeType, volumeID)
	if rec.count() != 1 || !reflect.DeepEqual(rec.calls[0], first) || again.Version != res.Version || m.volume() != want {
		t.Fatalf("calls %+v, version %d then %d, volume %+v", rec.calls, res.Version, again.Version, m.volume())
	}
}

// Not PID 1, machined sets no disk up: its volume/status (and ready line) say var=none.
func TestNotPID1TouchesNoDisk(t *testing.T) {
	m := &machine{con: quietConsole(), cfg: &Config{Install: InstallConfig{Disk: "/dev/vda"}}, params: map[string]string{},
		isReady: make(chan struct{}), version: "v1", kernel: "6.1"}
	m.startControllers(&applyRecorder{})
	if got := m.awaitVolumes(); got != (volumeSpec{Var: "none"}) {
		t.Fatalf("volume/status: %+v", got)
	}
	if got := m.Resources("volumes"); len(got) != 1 || got[0].Owner != "volumes" {
		t.Fatalf("kiln node get volumes: %+v", got)
	}
	if line := m.readyLine(); line != "machined ready: version=v1 kernel=6.1 extensions=[] var=none platform=metal" {
		t.Fatalf("ready line: %q", line)
	}
}

// diskRecorder stands in for releasing and mounting again (the e2e upgrade tests do the real
// unmounts and mounts): it counts each, and fails a release when told to.
type diskRecorder struct {
	mu                 sync.Mutex
	released, remounts int
	fail               error
}

func (d *diskRecorder) release(volumeSpec) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.released++
	return d.fail
}

func (d *diskRecorder) remount(volumeSpec) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.remounts++
}

func (d *diskRecorder) counts() (int, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.released, d.remounts
}

// The disk is released to an upgrade only once the services are stopped, once per upgrade; a
// failed upgrade gets it back; a release that fails says why, for that upgrade's number.
func TestTheDiskIsReleasedToAnUpgradeOnlyOnceTheServicesAreStopped(t *testing.T) {
	state := resource.NewState()
	owners := map[resource.Type]string{installConfigType: configOwner, upgradeType: upgradeOwner, serviceSetType: "service-set"}
	for typ, owner := range owners {
		if err := state.Claim(typ, owner); err != nil {
			t.Fatal(err)
		}
	}
	put := func(typ resource.Type, id string, spec interface{}) {
		t.Helper()
		if _, err := state.Put(owners[typ], typ, id, spec); err != nil {
			t.Fatal(err)
		}
	}
	disks, rec := &diskRecorder{}, &setupRecorder{}
	ctrl := runCounted(t, state, &volumesController{setup: rec.setup, release: disks.release, remount: disks.remount})
	m := &machine{con: quietConsole(), resources: state}
	put(serviceSetType, serviceSetID, serviceSetSpec{State: setRunning})
	put(installConfigType, installConfigID, installSpec{})
	m.awaitVolumes()
	runs := ctrl.count()
	put(upgradeType, upgradeID, &upgradeStatus{State: upgradeInstalling, Number: 1})
	wait.Until(t, "the run for the upgrade", 5*time.Second, func() bool { return ctrl.count() > runs })
	if released, _ := disks.counts(); released != 0 || m.volume().ReleasedFor != 0 {
		t.Fatalf("released while the services run: %d, %+v", released, m.volume())
	}
	put(serviceSetType, serviceSetID, serviceSetSpec{State: setStopped})
	wait.Until(t, "the disk released", 5*time.Second, func() bool { return m.volume().Released && m.volume().ReleasedFor == 1 })
	put(upgradeType, upgradeID, &upgradeStatus{State: upgradeRebooting, Number: 1})
	put(upgradeType, upgradeID, &upgradeStatus{State: upgradeFailed, Number: 1})
	wait.Until(t, "the disk back", 5*time.Second, func() bool { return m.volume().ReleasedFor == 0 })
	if released, remounts := disks.counts(); released != 1 || remounts != 1 {
		t.Fatalf("released %d times, mounted again %d times; want 1 and 1", released, remounts)
	}

	disks.mu.Lock()
	disks.fail = errors.New("unmount /var: device or resource busy (something still uses it)")
	disks.mu.Unlock()
	put(upgradeType, upgradeID, &upgradeStatus{State: upgradeInstalling, Number: 2})
	if err := m.awaitDiskReleased(2); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("a release that failed: %v", err)
	}
	put(upgradeType, upgradeID, &upgradeStatus{State: upgradeFailed, Number: 2})
	wait.Until(t, "the problem cleared", 5*time.Second, func() bool { v := m.volume(); return v.ReleasedFor == 0 && v.Problem == "" })
	if _, remounts := disks.counts(); remounts != 2 {
		t.Fatalf("a part-released disk is mounted again: %d", remounts)
	}
}

// What an installer gets released is on the disk only: a tmpfs /var, or a STATE that is not
// mounted, is neither unmounted nor mounted again; each comes back with the flags setup used.
func TestDiskMountsAreTheOwnedDisksOnly(t *testing.T) {
	both := diskMounts(volumeSpec{Var: "/dev/vda6", State: "/dev/vda5"})
	want := []diskMount{{"/var", "/dev/vda6", varFlags}, {stateMount, "/dev/vda5", stateFlags}}
	if !reflect.DeepEqual(both, want) {
		t.Fatalf("EPHEMERAL and STATE: %+v", both)
	}
	if got := diskMounts(volumeSpec{Var: "tmpfs", State: "/dev/vda5"}); len(got) != 1 || got[0].path != stateMount {
		t.Fatalf("a tmpfs /var: %+v", got)
	}
	if got := diskMounts(volumeSpec{Var: "/dev/vda6"}); len(got) != 1 || got[0].path != "/var" {
		t.Fatalf("no STATE: %+v", got)
	}
}
