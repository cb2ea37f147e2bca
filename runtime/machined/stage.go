package main

import (
	"context"
	"time"

	"kiln/machined/internal/resource"
)

// The machine's stage (machine/stage): where the boot or the shutdown is, which the boot puts and
// the controllers that run what serves the machine read. The services controller starts the
// supervisor once the boot says "starting" (the config is final, /var is set up, the network was
// waited for) and stops it at "stopping"; what it does in between follows the config and the
// upgrade (services_live.go).
const (
	stageType  resource.Type = "machine/stage"
	stageID                  = "machine"
	stageOwner               = readyOwner // the boot, which also puts machine/ready

	stageBooting  = "booting"  // the config, the disks and the network are being set up
	stageStarting = "starting" // the services start (the boot waits for them, then says ready)
	stageRunning  = "running"  // the ready line is out
	stageStopping = "stopping" // powering off or rebooting
)

// stageSpec is machine/stage.
type stageSpec struct {
	Stage  string `json:"stage"`
	Action string `json:"action,omitempty"` // when stopping: poweroff or reboot
}

// enterStage puts machine/stage; without controllers (a test's bare machine) there is none to tell.
func (m *machine) enterStage(stage, action string) {
	if m.resources == nil {
		return
	}
	if _, err := m.resources.Put(stageOwner, stageType, stageID, stageSpec{Stage: stage, Action: action}); err != nil {
		m.con.printf("stage: %v", err)
	}
}

// stageIn is machine/stage's stage as a run reads it, "" before the boot puts one.
func stageIn(r *resource.Run) string {
	spec, _ := specAt[stageSpec](r, stageType, stageID)
	return spec.Stage
}

// serving says whether a stage is one in which the machine's services run.
func serving(stage string) bool { return stage == stageStarting || stage == stageRunning }

// awaitFor waits at most limit for a resource that accept takes; false when the limit passed.
func (m *machine) awaitFor(t resource.Type, id string, limit time.Duration, accept func(resource.Resource) bool) (resource.Resource, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	res, err := m.resources.Await(ctx, t, id, accept)
	return res, err == nil
}
