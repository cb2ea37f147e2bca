package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/platform"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/testkit/wait"
)

// composing is the config controller alone over a state whose inputs the test puts as their
// owners would: the boot's source, the platform's facts, the disks, an apply.
type composing struct {
	t     *testing.T
	state *resource.State
	dir   string // STATE's mount point
	ctrl  *countedRuns
	con   *console
}

func newComposing(t *testing.T, hasState bool) *composing {
	t.Helper()
	c := &composing{t: t, state: resource.NewState(), dir: t.TempDir(), con: quietConsole()}
	for typ, owner := range map[resource.Type]string{
		configSourceType: bootConfigOwner, platType: "platform", volumeType: "volumes", configAppliedType: appliedOwner,
	} {
		if err := c.state.Claim(typ, owner); err != nil {
			t.Fatal(err)
		}
	}
	c.ctrl = runCounted(t, c.state, &configController{diskParam: "/dev/vdb", stateDir: c.dir,
		hasState: func() bool { return hasState }, driveAllowed: func(string) bool { return true }, say: c.con.printf})
	return c
}

func (c *composing) put(owner string, typ resource.Type, id string, spec interface{}) {
	c.t.Helper()
	runs := c.ctrl.count()
	if _, err := c.state.Put(owner, typ, id, spec); err != nil {
		c.t.Fatal(err)
	}
	wait.Until(c.t, "the config controller's run for "+string(typ), 5*time.Second, func() bool { return c.ctrl.count() > runs })
}

// booted puts the boot's own source and the platform's facts.
func (c *composing) booted(own sourceSpec, p *platformState) {
	c.t.Helper()
	c.put(bootConfigOwner, configSourceType, bootSourceID, own)
	c.put("platform", platType, platformID, platformSpec{fetched: p})
}

func (c *composing) machineConfig() (machineConfigSpec, bool) {
	res, ok := c.state.Get(machineConfigType, machineConfigID)
	if !ok {
		return machineConfigSpec{}, false
	}
	return resource.SpecOf[machineConfigSpec](res)
}

func (c *composing) kept() (keptSpec, bool) {
	res, ok := c.state.Get(keptConfigType, keptID)
	if !ok {
		return keptSpec{}, false
	}
	return resource.SpecOf[keptSpec](res)
}

func metal(t *testing.T) *platformState { return &platformState{impl: mustLookup(t, "metal")} }

// A boot without a config of its own, on a disk with STATE: the install section is out at once
// (the disks are set up from it), config/machine only once the kept config is read, and then
// it is that one, filled with the platform's hostname.
func TestTheKeptConfigRunsWhenTheBootHasNoneOfItsOwn(t *testing.T) {
	c := newComposing(t, true)
	kept := &Config{Network: staticConfig("10.0.2.77/24")}
	if err := keepConfigIn(c.dir, kept); err != nil {
		t.Fatal(err)
	}
	gcp := &platformState{impl: mustLookup(t, "gcp"), facts: platform.Facts{Hostname: "node-7"}}
	c.booted(sourceSpec{}, gcp)
	if res, ok := c.state.Get(installConfigType, installConfigID); !ok || res.Spec != (installSpec{Param: "/dev/vdb"}) {
		t.Fatalf("config/install: %+v", res)
	}
	if spec, ok := c.machineConfig(); ok {
		t.Fatalf("config/machine before the kept config was read: %+v", spec)
	}
	c.put("volumes", volumeType, volumeID, volumeSpec{Disk: "/dev/vda", Var: "/dev/vda6", State: "/dev/vda5"})
	spec, ok := c.machineConfig()
	path := filepath.Join(c.dir, keptConfigFile)
	if !ok || spec.Source != path || spec.Hostname != "node-7" || spec.Network.Interfaces[0].Addresses[0] != "10.0.2.77/24" || spec.Problem != "" {
		t.Fatalf("config/machine: %+v", spec)
	}
	if k, _ := c.kept(); k != (keptSpec{Action: keptUsed, Path: path}) {
		t.Fatalf("config/kept: %+v", k)
	}
}

// A boot's own config, with the network the platform's facts fill in, is out before the disks are
// set up (the network starts on it), and is kept on STATE for the next boot, 0600 as it holds
// the API's key.
func TestTheBootsOwnConfigIsKeptForTheNextBoot(t *testing.T) {
	c := newComposing(t, true)
	own := &Config{Hostname: "from-drive", Install: InstallConfig{Disk: "/dev/vda"}}
	facts := platform.Facts{Network: &platform.Network{Interfaces: []platform.Interface{{Name: "eth0", Addresses: []string{"10.0.2.9/24"}}}}}
	c.booted(sourceSpec{Source: "/dev/sr0:kiln.yaml", Config: own}, &platformState{impl: mustLookup(t, "gcp"), facts: facts})
	if spec, ok := c.machineConfig(); !ok || spec.Source != "/dev/sr0:kiln.yaml" || spec.Hostname != "from-drive" ||
		len(spec.Network.Interfaces) != 1 || spec.Network.Interfaces[0].Addresses[0] != "10.0.2.9/24" {
		t.Fatalf("config/machine before the disks: %+v", spec)
	}
	if res, _ := c.state.Get(installConfigType, installConfigID); res.Spec != (installSpec{Disk: "/dev/vda", Param: "/dev/vdb"}) {
		t.Fatalf("config/install: %+v", res.Spec)
	}
	before, _ := c.state.Get(machineConfigType, machineConfigID)
	c.put("volumes", volumeType, volumeID, volumeSpec{Disk: "/dev/vda", Var: "/dev/vda6", State: "/dev/vda5"})
	path := filepath.Join(c.dir, keptConfigFile)
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("kept: %v %v", info, err)
	}
	if back, err := readKeptConfig(c.dir); err != nil || back.Hostname != "from-drive" {
		t.Fatalf("the kept config reads back as %+v, %v", back, err)
	}
	after, _ := c.state.Get(machineConfigType, machineConfigID)
	if k, _ := c.kept(); k != (keptSpec{Action: keptWritten, Path: path}) || after.Version != before.Version {
		t.Fatalf("config/kept %+v; config/machine version %d then %d", k, before.Version, after.Version)
	}
	if own.Hostname != "from-drive" || own.Network.Interfaces != nil {
		t.Fatal("the source's config was changed in place")
	}
}

// A kept config that cannot be used (not a config, or a link planted in its place) leaves the
// defaults and says why: the trial and the health verdict read the problem.
func TestAKeptConfigThatCannotBeUsedIsAProblem(t *testing.T) {
	for name, plant := range map[string]func(dir string) error{
		"garbage": func(dir string) error {
			return os.WriteFile(filepath.Join(dir, keptConfigFile), []byte("{not: [json"), 0o600)
		},
		"link": func(dir string) error {
			secret := filepath.Join(t.TempDir(), "secret.json")
			if err := os.WriteFile(secret, []byte(`{"hostname": "planted"}`), 0o600); err != nil {
				return err
			}
			return os.Symlink(secret, filepath.Join(dir, keptConfigFile))
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := newComposing(t, true)
			if err := plant(c.dir); err != nil {
				t.Fatal(err)
			}
			c.booted(sourceSpec{}, metal(t))
			c.put("volumes", volumeType, volumeID, volumeSpec{Disk: "/dev/vda", Var: "/dev/vda6", State: "/dev/vda5"})
			spec, ok := c.machineConfig()
			if !ok || spec.Source != "" || spec.Hostname != "" || !strings.HasPrefix(spec.Problem, "kept config: ") {
				t.Fatalf("config/machine: %+v", spec)
			}
			if k, _ := c.kept(); k.Action != keptNone || k.Problem == "" {
				t.Fatalf("config/kept: %+v", k)
			}
		})
	}
}

// Diskless (no STATE anywhere), the config is out at once, and nothing is kept.
func TestADisklessBootKeepsNothing(t *testing.T) {
	c := newComposing(t, false)
	c.booted(sourceSpec{Problem: "kiln.config=http://x: refused"}, metal(t))
	if spec, ok := c.machineConfig(); !ok || spec.Source != "" || spec.Problem != "kiln.config=http://x: refused" {
		t.Fatalf("config/machine: %+v", spec)
	}
	c.put("volumes", volumeType, volumeID, volumeSpec{Var: "tmpfs"})
	if k, _ := c.kept(); k != (keptSpec{Action: keptNone}) {
		t.Fatalf("config/kept: %+v", k)
	}
	if _, err := os.Stat(filepath.Join(c.dir, keptConfigFile)); !os.IsNotExist(err) {
		t.Fatalf("something was kept: %v", err)
	}
}

// What the API applies is the running config from then on, whatever the boot composed.
func TestAnAppliedConfigIsTheRunningOne(t *testing.T) {
	c := newComposing(t, false)
	c.booted(sourceSpec{Source: "kiln.config=/etc/kiln.yaml", Config: &Config{Hostname: "booted"}}, metal(t))
	booted, _ := c.machineConfig()
	applied := appliedSpec(booted, "POST /v1/config by admin", &Config{Hostname: "applied"})
	c.put(appliedOwner, configAppliedType, appliedID, applied)
	if spec, _ := c.machineConfig(); spec.Hostname != "applied" || spec.Source != "POST /v1/config by admin" || spec.Config.Hostname != "applied" {
		t.Fatalf("config/machine: %+v", spec)
	}
	c.put("volumes", volumeType, volumeID, volumeSpec{Var: "tmpfs"}) // a later input changes nothing of it
	if spec, _ := c.machineConfig(); spec.Hostname != "applied" {
		t.Fatalf("config/machine after the disks: %+v", spec)
	}
}
