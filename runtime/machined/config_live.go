package main

import (
	"context"
	"syscall"

	"kiln/machined/internal/resource"
)

// The controllers that apply the machine config's hostname and time servers whenever
// config/machine changes (at boot, and when a config is applied over the API), and its services
// (services_live.go). None owns a resource: the hostname shows in the status, the time server in
// use in its time section, the services as service/status.

// hostnameController sets the config's hostname; a config without one leaves it as it is.
type hostnameController struct {
	set func(name string) error
}

func (c *hostnameController) Name() string             { return "hostname" }
func (c *hostnameController) Inputs() []resource.Type  { return []resource.Type{machineConfigType} }
func (c *hostnameController) Outputs() []resource.Type { return nil }

func (c *hostnameController) Reconcile(ctx context.Context, r *resource.Run) error {
	spec, ok := runningConfigSpec(r)
	if !ok || spec.Hostname == "" {
		return nil
	}
	return c.set(spec.Hostname)
}

// timeController hands the config's time servers to the clock (which falls back on the
// platform's or DHCP's when the config names none).
type timeController struct {
	apply func(configured []string)
}

func (c *timeController) Name() string             { return "time" }
func (c *timeController) Inputs() []resource.Type  { return []resource.Type{machineConfigType} }
func (c *timeController) Outputs() []resource.Type { return nil }

func (c *timeController) Reconcile(ctx context.Context, r *resource.Run) error {
	if spec, ok := runningConfigSpec(r); ok {
		c.apply(spec.TimeServers)
	}
	return nil
}

// runningConfigSpec is config/machine's spec while it is running.
func runningConfigSpec(r *resource.Run) (machineConfigSpec, bool) {
	return specAt[machineConfigSpec](r, machineConfigType, machineConfigID)
}

// liveControllers are the hostname, time and services controllers of this machine: only PID 1 sets the
// hostname (a test may set live.setHostname), and the clock is there once startClock ran.
func (m *machine) liveControllers() []resource.Controller {
	set := m.live.setHostname
	if set == nil {
		set = func(string) error { return nil }
		if m.pid1 {
			set = func(name string) error { return syscall.Sethostname([]byte(name)) }
		}
	}
	services := &servicesController{logDir: m.logDir, publish: m.setSupervisor, printf: m.con.printf}
	return []resource.Controller{&hostnameController{set: set}, &timeController{apply: m.useTimeServers}, services}
}

// useTimeServers points the running clock at the configured servers, or the fallbacks.
func (m *machine) useTimeServers(configured []string) {
	m.live.clockMu.Lock()
	clock := m.clock
	m.live.clockMu.Unlock()
	if clock != nil {
		clock.SetServers(m.chooseTimeServers(configured))
	}
}

// chooseTimeServers: the config's servers, else the platform's time service, else DHCP's
// (which may arrive after the first lease: startClock looks for them again).
func (m *machine) chooseTimeServers(configured []string) []string {
	if len(configured) > 0 {
		return configured
	}
	if servers := platformTimeNTP[m.fetchedPlatform().name()]; len(servers) > 0 {
		return servers
	}
	return m.net.NTPServers()
}
