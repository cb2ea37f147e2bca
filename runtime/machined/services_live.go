package main

import (
	"context"
	"errors"
	"strings"

	"kiln/machined/internal/resource"
	"kiln/machined/internal/supervisor"
)

// servicesController keeps the running services equal to the extensions' (extension/services,
// which the extensions controller puts) with the machine config's laid over them
// (supervisor.MergeServices), whenever config/machine changes: a config
// applied over the API starts a new service, restarts a changed one and stops a removed one,
// and the others run on untouched (supervisor.Update). The boot starts the supervisor once /var
// is mounted (machine.startServices, from the running config); before that, and while an
// upgrade has the services stopped, there is nothing to update, and the next start reads the
// running config anyway.
type servicesController struct {
	current func() *supervisor.Supervisor // the supervisor running now, nil before the boot starts one
	printf  func(format string, args ...interface{})
}

func (c *servicesController) Name() string { return "service-set" }
func (c *servicesController) Inputs() []resource.Type {
	return []resource.Type{machineConfigType, extensionServicesType}
}
func (c *servicesController) Outputs() []resource.Type { return nil } // service/status is observed

func (c *servicesController) Reconcile(_ context.Context, r *resource.Run) error {
	spec, ok := runningConfigSpec(r)
	ext, read := r.Get(extensionServicesType, extensionServicesID)
	extensions, _ := resource.SpecOf[extensionServicesSpec](ext)
	sup := c.current()
	if !ok || !read || sup == nil {
		return nil // the supervisor starts with the extensions' services: never update it without them
	}
	changes, err := sup.Update(supervisor.MergeServices(extensions.Specs, spec.Services))
	switch {
	case errors.Is(err, supervisor.ErrStopped):
		return nil // an upgrade or a shutdown stopped them; what starts them next reads the running config
	case err != nil:
		// the parser checks each service, not the set's dependencies: keep what runs
		c.printf("services: %v; the running services are kept", err)
		return nil
	}
	if !changes.Empty() {
		c.printf("services: %s", describeChanges(changes))
	}
	return nil
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
