package main

import (
	"context"
	"fmt"
	"syscall"

	"kiln/machined/internal/disk"
	"kiln/machined/internal/resource"
)

// The disks and mounts controller owns volume/status: where the machine keeps what it writes.
// The config controller puts the config's install section (config/install) once it has the
// boot's own config and the platform's, or knows there is none; this controller then chooses
// the disk, prepares STATE and EPHEMERAL, mounts them and puts volume/status. It does so once
// per boot: the disks a later config names (the one kept on STATE, or one applied over the API)
// are for the next boot, as docs/machine-config.md says. What needs /var or STATE waits for
// volume/status (machine.awaitVolumes) and reads the devices from it.
//
// While an upgrade installs (upgrade/status) and the services are stopped (service/set), it
// releases the disk to the installer: /var and STATE are unmounted, which volume/status says for
// that upgrade's number (the upgrader waits for it). When the upgrade fails it mounts them again,
// and the services controller starts the services on them.
const (
	installConfigType resource.Type = "config/install"
	volumeType        resource.Type = "volume/status"

	installConfigID = "install"
	volumeID        = "volumes"
)

// installSpec is what chooses and prepares the disk: the config's install section and kiln.disk=.
type installSpec struct {
	Disk       string `json:"disk,omitempty"`
	Filesystem string `json:"filesystem,omitempty"`
	Param      string `json:"param,omitempty"` // kiln.disk= on the kernel command line
}

// volumeSpec is where the machine keeps what it writes: the disk it owns and what is mounted from it.
type volumeSpec struct {
	Disk  string `json:"disk,omitempty"`  // the disk machined owns ("" when none)
	Var   string `json:"var"`             // /var's source: EPHEMERAL's partition, or tmpfs
	State string `json:"state,omitempty"` // STATE's partition, mounted at stateMount ("" when not)
	// the disk released to an upgrade's installer: for which upgrade (upgrade/status's number),
	// and whether that worked (Released) or why not (Problem)
	Released    bool   `json:"released,omitempty"`
	ReleasedFor int    `json:"released_for,omitempty"`
	Problem     string `json:"problem,omitempty"`
}

// volumesController sets the disks up once, from the first config/install it reads, and
// releases them to an upgrade's installer and takes them back (see above).
type volumesController struct {
	setup   func(installSpec) volumeSpec // the disk work (machine.setupVolumes; a recorder in tests)
	release func(volumeSpec) error       // unmounts /var and STATE (nil: nothing to unmount)
	remount func(volumeSpec)             // mounts what release unmounted (nil: nothing to mount)
	// only this controller's goroutine touches these
	done        *volumeSpec // what setup gave
	releasedFor int         // the upgrade the disk was released to, 0 when it is mounted
	problem     string      // why releasing it failed
}

func (c *volumesController) Name() string { return "volumes" }
func (c *volumesController) Inputs() []resource.Type {
	return []resource.Type{installConfigType, upgradeType, serviceSetType}
}
func (c *volumesController) Outputs() []resource.Type { return []resource.Type{volumeType} }

func (c *volumesController) Reconcile(_ context.Context, r *resource.Run) error {
	if c.done == nil {
		res, ok := r.Get(installConfigType, installConfigID)
		if !ok || res.Phase != resource.Running {
			return nil // the boot has not said which disk yet
		}
		install, _ := resource.SpecOf[installSpec](res)
		v := c.setup(install)
		c.done = &v
	}
	upgrade, _ := specAt[*upgradeStatus](r, upgradeType, upgradeID)
	holds := upgrade != nil && upgradeHoldsDisk(upgrade.State)
	set, _ := specAt[serviceSetSpec](r, serviceSetType, serviceSetID)
	switch {
	case holds && set.State == setStopped && c.releasedFor != upgrade.Number:
		c.releasedFor, c.problem = upgrade.Number, ""
		if c.release != nil {
			if err := c.release(*c.done); err != nil {
				c.problem = err.Error()
			}
		}
	case !holds && c.releasedFor != 0:
		if c.remount != nil {
			c.remount(*c.done)
		}
		c.releasedFor, c.problem = 0, ""
	}
	v := *c.done
	v.ReleasedFor, v.Problem = c.releasedFor, c.problem
	v.Released = c.releasedFor != 0 && c.problem == ""
	return r.Put(volumeType, volumeID, v)
}

// awaitVolumes waits for the disks' setup. It has no limit of its own, as formatting a large
// disk takes what it takes: on a trial slot, the trial deadline (watchTrial) still reboots a boot
// that hangs here.
func (m *machine) awaitVolumes() volumeSpec {
	v, _ := resource.SpecOf[volumeSpec](m.awaitBoot(volumeType, volumeID))
	return v
}

// volume is volume/status's spec: what the disks' setup gave, {Var: "none"} when nothing set
// disks up (machined not PID 1, or before the setup is done).
func (m *machine) volume() volumeSpec {
	if m.resources != nil {
		if res, ok := m.resources.Get(volumeType, volumeID); ok {
			if v, ok := resource.SpecOf[volumeSpec](res); ok {
				return v
			}
		}
	}
	return volumeSpec{Var: "none"}
}

// noVolumes is the disks' setup of a machined that is not PID 1: none.
func noVolumes(installSpec) volumeSpec { return volumeSpec{Var: "none"} }

// setupVolumes mounts /var: EPHEMERAL on the owned disk, with STATE beside it, or a tmpfs when
// there is none (or the disk cannot be set up, which is said on the console).
func (m *machine) setupVolumes(install installSpec) volumeSpec {
	var v volumeSpec
	owned, why := disk.ChooseDisk(disk.ListBlockDevices("/sys"), install.Disk, install.Param, disk.IsBlank)
	if owned != "" {
		m.con.printf("disk: using %s (%s)", owned, why)
		v.Disk = owned
		state, ephemeral, err := disk.Prepare(owned, install.Filesystem, m.con.printf)
		if err == nil {
			err = mountFS(ephemeral, "/var", varFlags)
		}
		if err != nil {
			m.con.printf("disk: %v; /var is a tmpfs", err)
		} else {
			v.Var = ephemeral
			if err := mountFS(state, stateMount, stateFlags); err != nil {
				m.con.printf("disk: STATE: %v", err)
			} else {
				v.State = state
			}
		}
	} else {
		m.con.printf("disk: none (%s); /var is a tmpfs", why)
	}
	if v.Var == "" {
		if err := syscall.Mount("tmpfs", "/var", "tmpfs", varFlags, "mode=0755"); err != nil {
			m.con.printf("tmpfs /var: %v", err)
		}
		v.Var = "tmpfs"
	}
	populateVar()
	return v
}

// How /var (EPHEMERAL, or a tmpfs) and STATE are mounted.
const (
	varFlags   = syscall.MS_NOSUID | syscall.MS_NODEV
	stateFlags = syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC
)

// diskMount is one filesystem on the owned disk that the machine mounts.
type diskMount struct {
	path, source string
	flags        uintptr
}

// diskMounts are /var and STATE as v has them, those on the disk only (not a tmpfs /var, nor a
// STATE that is not mounted): what an installer needs unmounted, and what comes back after.
func diskMounts(v volumeSpec) []diskMount {
	var out []diskMount
	for _, d := range []diskMount{{"/var", v.Var, varFlags}, {stateMount, v.State, stateFlags}} {
		if d.source != "" && d.source != "tmpfs" {
			out = append(out, d)
		}
	}
	return out
}

// releaseVolumes unmounts /var (unless it is a tmpfs, which is not on the disk) and STATE, so
// nothing on the owned disk is in use while an installer writes it.
func releaseVolumes(v volumeSpec) error {
	syscall.Sync()
	for _, d := range diskMounts(v) {
		if _, ok := mountedAt(readMounts(), d.path); !ok {
			continue
		}
		if err := syscall.Unmount(d.path, 0); err != nil {
			return fmt.Errorf("unmount %s: %v (something still uses it)", d.path, err)
		}
	}
	return nil
}

// remountVolumes mounts again what releaseVolumes unmounted, and what /var must hold.
func (m *machine) remountVolumes(v volumeSpec) {
	for _, d := range diskMounts(v) {
		if _, ok := mountedAt(readMounts(), d.path); ok {
			continue
		}
		if err := mountFS(d.source, d.path, d.flags); err != nil {
			m.con.printf("disk: mounting %s again: %v", d.path, err)
		}
	}
	populateVar()
	m.con.printf("disk: /var and STATE are mounted again")
}
