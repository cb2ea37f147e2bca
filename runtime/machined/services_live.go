package main

import (
	"context"
	"strings"

	"kiln/machined/internal/resource"
	"kiln/machined/internal/supervisor"
)

// The services controller owns the supervisor and service/set: it starts the extensions'
// services (extension/services, which the extensions controller puts) with the machine config's
// laid over them (supervisor.MergeServices) once the boot is starting them (machine/stage) and
// /var is mounted (volume/status); from then on a config applied over the API starts a new
// service, restarts a changed one and stops a removed one while the others run on untouched
// (supervisor.Update). It stops them all while an upgrade installs (upgrade/status), so that the
// volumes controller can release the disk to the installer, and starts them again from the
// running config when the upgrade fails and /var is back; it stops them when the machine stops.
const (
	serviceSetType resource.Type = "service/set"
	serviceSetID                 = "services"

	setWaiting = "waiting" // for the boot, the config, the extensions' services or /var
	setRunning = "running"
	setStopped = "stopped" // an upgrade installs, or the machine stops
)

// serviceSetSpec is service/set: whether the supervisor runs the machine's services, and why not.
type serviceSetSpec struct {
	State         string `json:"state"`
	Reason        string `json:"reason,omitempty"`         // what it waits for, or what stopped it
	ConfigVersion uint64 `json:"config_version,omitempty"` // the config/machine version the running set follows
	Problem       string `json:"problem,omitempty"`        // why the set, or its last change, could not start
}

// servicesController runs the machine's services (see above).
type servicesController struct {
	logDir  string                       // where each service's log file goes ("": memory only)
	publish func(*supervisor.Supervisor) // hands the supervisor to the API's readers (machine.setSupervisor)
	printf  func(format string, args ...interface{})
	// only this controller's goroutine touches these
	sup     *supervisor.Supervisor // the supervisor it started last, nil before the first
	stopped bool                   // sup is stopped, and the next start is a new supervisor
	problem string                 // why the set, or its last change, could not start
}

func (c *servicesController) Name() string { return "service-set" }
func (c *servicesController) Inputs() []resource.Type {
	return []resource.Type{stageType, machineConfigType, extensionServicesType, volumeType, upgradeType}
}
func (c *servicesController) Outputs() []resource.Type { return []resource.Type{serviceSetType} }

func (c *servicesController) Reconcile(_ context.Context, r *resource.Run) error {
	if why := holdReason(r); why != "" {
		if c.sup != nil && !c.stopped {
			c.printf("services: stopping them all, as %s", why)
			c.sup.Stop()
			c.stopped = true
		}
		return r.Put(serviceSetType, serviceSetID, serviceSetSpec{State: setStopped, Reason: why})
	}
	res, _ := r.Get(machineConfigType, machineConfigID)
	config, configured := runningConfigSpec(r)
	extensions, read := specAt[extensionServicesSpec](r, extensionServicesType, extensionServicesID)
	vol, set := specAt[volumeSpec](r, volumeType, volumeID)
	waiting := ""
	switch {
	case !serving(stageIn(r)):
		waiting = "the boot"
	case !configured:
		waiting = "the machine config"
	case !read: // merged without them, the config's set would stop the extensions' services
		waiting = "the extensions' services"
	case !set || vol.Released:
		waiting = "/var"
	}
	if waiting != "" {
		return r.Put(serviceSetType, serviceSetID, serviceSetSpec{State: setWaiting, Reason: waiting})
	}
	specs := supervisor.MergeServices(extensions.Specs, config.Services)
	if c.sup == nil || c.stopped {
		c.start(specs)
	} else {
		c.update(specs)
	}
	return r.Put(serviceSetType, serviceSetID, serviceSetSpec{State: setRunning, ConfigVersion: res.Version, Problem: c.problem})
}

// holdReason is why the services must not run now ("" when they may): the machine stops, or an
// upgrade installs (or has installed and reboots), which needs the disk they write to.
func holdReason(r *resource.Run) string {
	if stageIn(r) == stageStopping {
		return "the machine stops"
	}
	if u, ok := specAt[*upgradeStatus](r, upgradeType, upgradeID); ok && u != nil && upgradeHoldsDisk(u.State) {
		return "an upgrade " + u.State + " slot " + u.Slot
	}
	return ""
}

// upgradeHoldsDisk says whether an upgrade in state needs the owned disk to itself.
func upgradeHoldsDisk(state string) bool {
	return state == upgradeInstalling || state == upgradeRebooting
}

// start starts a new supervisor with specs. A set that cannot start (its dependencies do not
// resolve) starts nothing, and the supervisor is kept all the same: a config applied later can
// start them.
func (c *servicesController) start(specs []supervisor.ServiceSpec) {
	again := c.sup != nil
	opts := supervisor.DefaultOptions()
	opts.LogDir = c.logDir
	opts.Events = func(line string) { c.printf("%s", line) }
	sup := supervisor.New(opts)
	c.problem = ""
	if err := sup.Start(specs); err != nil {
		c.printf("services: %v; none started", err)
		c.problem = err.Error()
	} else if again {
		c.printf("services: started again")
	}
	c.sup, c.stopped = sup, false
	c.publish(sup)
}

// update makes the running set specs, and says what changed.
func (c *servicesController) update(specs []supervisor.ServiceSpec) {
	changes, err := c.sup.Update(specs)
	if err != nil {
		// the parser checks each service, not the set's dependencies: keep what runs
		c.printf("services: %v; the running services are kept", err)
		c.problem = err.Error()
		return
	}
	c.problem = ""
	if !changes.Empty() {
		c.printf("services: %s", describeChanges(changes))
	}
}

// describeChanges is the console's line for an update: "started web; restarted db; stopped old".
func describeChanges(c supervisor.Changes) string {
	var parts []string
	for _, part := range []struct {
		verb  string
		names []string
	}{{"started", c.Started}, {"restarted", c.Restarted}, {"stopped", c.Stopped}} {
		if len(part.names) > 0 {
			parts = append(parts, part.verb+" "+strings.Join(part.names, ", "))
		}
	}
	return strings.Join(parts, "; ")
}
