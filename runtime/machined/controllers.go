package main

import (
	"context"
	"fmt"
	"time"

	"kiln/machined/internal/disk"
	"kiln/machined/internal/network"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/safego"
	"kiln/machined/internal/supervisor"
)

// The machine's resources (internal/resource) and the controllers that own them.
//
// The config controller owns the machine config resource (config_controller.go): it puts the
// config it has at each point of the boot (a config drive's or URL's, then the one kept on STATE
// once /var is set up, then what the API applies), and the controllers that read it converge on
// the latest, whatever they did for an earlier one.
const (
	machineConfigType resource.Type = "config/machine"
	networkStatusType resource.Type = "network/status"

	machineConfigID = "machine" // the one machine config resource
	networkStatusID = "applied" // the one network status resource

	configOwner = "config"

	readyType  resource.Type = "machine/ready" // the ready line's facts, once the machine is ready
	readyID                  = "machine"
	readyOwner               = "boot"
)

// machineConfigSpec is the machine config: where it came from, the sections the controllers
// apply, and the whole config for the rest of machined.
type machineConfigSpec struct {
	Source      string                `json:"source"`
	Problem     string                `json:"problem,omitempty"` // why a config that was there is not the one running
	Network     network.NetworkConfig `json:"network"`
	Hostname    string                `json:"hostname,omitempty"`     // the hostname controller's (config_live.go)
	TimeServers []string              `json:"time_servers,omitempty"` // the time controller's
	// the services controller's (services_live.go); not shown, as a service's env may hold secrets
	Services []supervisor.ServiceSpec `json:"-"`
	// the whole config (the API, health checks, upgrades read it); not shown, as it holds the API's key
	Config *Config `json:"-"`
}

// networkStatusSpec says which machine config version's network is applied.
type networkStatusSpec struct {
	ConfigVersion uint64 `json:"config_version"`
	Source        string `json:"source"`
}

// networkApplier is what the network controller drives (network.Network; a recorder in tests).
type networkApplier interface {
	Apply(cfg network.NetworkConfig, wait time.Duration)
}

// networkController makes the links, addresses, routes, resolvers and DHCP clients what the
// latest machine config says (network.Apply: DHCP stopped where the config turns it off).
type networkController struct {
	net  networkApplier
	wait time.Duration // for the first DHCP leases of each apply
}

func (c *networkController) Name() string             { return "network" }
func (c *networkController) Inputs() []resource.Type  { return []resource.Type{machineConfigType} }
func (c *networkController) Outputs() []resource.Type { return []resource.Type{networkStatusType} }

func (c *networkController) Reconcile(ctx context.Context, r *resource.Run) error {
	res, ok := r.Get(machineConfigType, machineConfigID)
	if !ok || res.Phase != resource.Running {
		return nil // no config yet: nothing to apply (and no status)
	}
	spec, ok := resource.SpecOf[machineConfigSpec](res)
	if !ok {
		return fmt.Errorf("%s/%s holds a %T", machineConfigType, machineConfigID, res.Spec)
	}
	c.net.Apply(spec.Network, c.wait)
	return r.Put(networkStatusType, networkStatusID, networkStatusSpec{ConfigVersion: res.Version, Source: spec.Source})
}

// startControllers makes the machine's resource state and runs its controllers for good.
func (m *machine) startControllers(net networkApplier) {
	m.resources = resource.NewState()
	rt := resource.NewRuntime(m.resources, m.con.printf)
	owners := map[resource.Type]string{
		configAppliedType: appliedOwner, readyType: readyOwner, stageType: stageOwner, upgradeType: upgradeOwner,
		upgradeAskType: upgradeAskOwner, rollbackAskType: rollbackAskOwner,
	}
	for t, owner := range owners {
		if err := m.resources.Claim(t, owner); err != nil {
			m.fatal("resources: %v", err)
		}
	}
	m.enterStage(stageBooting, "")
	m.publishUpgrades()
	setup, bootConfig := m.setupVolumes, m.readBootConfig
	release, remount := releaseVolumes, m.remountVolumes
	hasState := func() bool { return hasStatePartition(disk.ListBlockDevices("/sys")) }
	if !m.pid1 {
		// not PID 1, machined touches no disk, and its config is -config's
		own := sourceSpec{Source: m.configSource, Config: m.cfg}
		setup, bootConfig, hasState = noVolumes, func() sourceSpec { return own }, func() bool { return false }
		release, remount = nil, nil
	}
	owning := []resource.Controller{
		&bootConfigController{read: bootConfig},
		&configController{diskParam: m.params[paramDisk], stateDir: stateMount, hasState: hasState,
			driveAllowed: m.configDriveAllowed, say: m.con.printf},
		&networkController{net: net, wait: 5 * time.Second}, &volumesController{setup: setup, release: release, remount: remount},
		&extensionsController{dirs: m.extDirs, printf: m.con.printf},
		&platformController{fetch: m.fetchPlatform, report: m.reportReady},
		&apiController{serve: m.openAPI, publish: m.setRunningAPI, say: m.con.printf},
		&healthController{judge: m.judgeHealth, interval: m.healthInterval},
		&trialController{gate: m.trialGateAt, good: m.markTrialGood, fail: m.failTrial},
		&upgradeController{run: m.runUpgrade}, &rollbackController{run: m.rollBack},
	}
	for _, c := range append(append(owning, m.observers()...), m.liveControllers()...) {
		if err := rt.Register(c); err != nil {
			m.fatal("resources: %v", err)
		}
	}
	safego.Go("controllers", func() { rt.Run(context.Background()) })
}

// awaitBoot waits, with no limit of its own, for a resource the boot cannot go on without. What
// puts it is bounded (fetches by their deadlines), or on a trial slot the trial deadline
// (watchTrial) reboots a boot that hangs here.
func (m *machine) awaitBoot(t resource.Type, id string) resource.Resource {
	res, _ := m.resources.Await(context.Background(), t, id, nil) // no error: the context never ends
	return res
}

// awaitInstall waits for the config controller's first composition, which puts the install section.
func (m *machine) awaitInstall() { m.awaitBoot(installConfigType, installConfigID) }

// waitNetwork waits until the network controller has applied machine config version (or
// limit passes: the network then goes on converging in the background, as a slow DHCP
// server's lease does).
func (m *machine) waitNetwork(version uint64, limit time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	applied := func(res resource.Resource) bool {
		spec, ok := resource.SpecOf[networkStatusSpec](res)
		return ok && spec.ConfigVersion >= version
	}
	if _, err := m.resources.Await(ctx, networkStatusType, networkStatusID, applied); err != nil {
		m.con.printf("network: the config's network is not applied after %s; going on", limit)
	}
}

// apiResource is one resource as GET /v1/resources shows it (kiln node get).
type apiResource struct {
	Type    string      `json:"type"`
	ID      string      `json:"id"`
	Version uint64      `json:"version"`
	Phase   string      `json:"phase"`
	Owner   string      `json:"owner"`
	Spec    interface{} `json:"spec"`
}

// resourceTypes are the types the machine has, in the order GET /v1/resources lists them.
var resourceTypes = []resource.Type{
	machineConfigType, configSourceType, installConfigType, keptConfigType, configAppliedType, networkStatusType, linkType, addressType, serviceSetType, serviceType, bootType, timeType,
	volumeType, extensionType, extensionServicesType, platType, apiStatusType, upgradeAskType, upgradeType, rollbackAskType, rollbackType, healthType, stageType, readyType,
}

// typeAliases are the short names `kiln node get` takes for the types (as talosctl get does).
var typeAliases = map[string]resource.Type{
	"config": machineConfigType, "config-source": configSourceType, "install": installConfigType,
	"kept-config": keptConfigType, "applied-config": configAppliedType, "links": linkType, "addresses": addressType,
	"services": serviceType, "service-set": serviceSetType, "bootstate": bootType, "time": timeType, "volumes": volumeType,
	"extensions": extensionType, "extension-services": extensionServicesType, "platform": platType, "api": apiStatusType,
	"upgrade": upgradeType, "upgrade-request": upgradeAskType, "rollback-request": rollbackAskType, "rollback": rollbackType, "health": healthType, "ready": readyType, "stage": stageType,
}

// canonicalType is the type an API request names, by its full name or its alias.
func canonicalType(t string) string {
	if full, ok := typeAliases[t]; ok {
		return string(full)
	}
	return t
}

// Resources lists the machine's resources of type t (every type when t is ""); none before
// the boot has made its state.
func (m *machine) Resources(t string) []apiResource {
	out := []apiResource{}
	if m.resources == nil {
		return out
	}
	t = canonicalType(t)
	for _, rt := range resourceTypes {
		if t != "" && string(rt) != t {
			continue
		}
		for _, r := range m.resources.List(rt) {
			out = append(out, apiResourceOf(r))
		}
	}
	return out
}
