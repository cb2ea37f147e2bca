package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"kiln/machined/internal/disk"
	"kiln/machined/internal/network"
	"kiln/machined/internal/ntp"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/safego"
	"kiln/machined/internal/supervisor"
)

// machine is machined's state: what the boot found and set up, served by the API.
type machine struct {
	pid1          bool
	con           *console
	version       string
	kernel        string
	params        map[string]string
	cfg           *Config // the boot's config as the config controller composed it (awaitConfig); -config's not PID 1
	configSource  string  // where it came from ("" for defaults)
	configProblem string  // why a config that was there could not be used ("" when none), for the trial's verdict
	extensions    []Extension
	schematic     string // the image's schematic ID (kiln image --schematic), "" for none
	net           *network.Network
	resources     *resource.State        // the machine's resources, which its controllers keep (controllers.go)
	live          liveConfig             // the config it runs now, and applying a new one (config_apply.go)
	supMu         sync.Mutex             // guards sup, which the services controller replaces
	sup           *supervisor.Supervisor // read through currentSupervisor()
	logDir        string                 // where the services' log files go ("": memory only)
	extDirs       extensionDirs          // where the extensions controller reads them (extensions.go)
	started       time.Time
	power         chan string
	shutdownOnce  sync.Once
	slots         *slots        // the A/B boot state; empty when the boot came from no A/B disk
	upgrades      upgrader      // the upgrade under way or the last one that failed
	rollbacks     rollbackAsks  // the rollbacks the API asked for (rollback.go)
	isReady       chan struct{} // closed once the machine is ready
	readyAt       time.Time     // when it was; set before isReady is closed
	clock         *ntp.Syncer   // nil when time sync is off
	firmware      firmwareState // UEFI or BIOS, and whether Secure Boot is on
	lockdown      string        // the kernel's lockdown mode ("" without the lockdown LSM)
	tpm           *tpmState     // PCR 11 of the TPM 2.0, nil without one
	phases        phases        // how long each part of the boot took
	configDrive   driveVerdict  // whether a config drive may replace the kept config (configsource_drive.go)
}

// boot brings the machine up as PID 1, in order: kernel filesystems and the read-only root
// check, drivers, config, then network and disk side by side, services, API, ready line.
func (m *machine) boot() {
	if err := mountBase(); err != nil {
		m.con = newConsole(os.Stdout)
		m.fatal("%v", err)
	}
	m.con = newConsole(os.Stdout) // /dev is certainly there now
	if ok, what := rootReadOnly(readMounts()); !ok {
		m.fatal("the root filesystem must be read-only and is not: %s; refusing to continue", what)
	}
	// with Ctrl-Alt-Del off the kernel sends PID 1 a SIGINT instead of rebooting at once
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_CAD_OFF)
	m.params = readCmdline()
	m.kernel = kernelRelease()
	m.con.printf("version %s starting on kernel %s", m.version, m.kernel)
	if err := mountEFIVars(); err != nil {
		m.con.printf("firmware: %v", err)
	}
	m.firmware = readFirmware(efiDir)
	m.con.printf("firmware: %s", m.firmware.describe())
	m.phases.mark("start")
	loaded := loadModules(m.kernel, m.con.printf)
	loaded += loadExtensionModules(modprobe, listExtensions(extensionsDir), m.con.printf)
	m.phases.mark("modules")
	if err := mountSecurityFS(); err != nil {
		m.con.printf("%v", err)
	}
	m.lockdown = readLockdown(lockdownFile)
	m.con.printf("%s", describeModules(loadedModules(modulesFile), m.lockdown))
	m.tpm = readTPM(tpmDir)
	m.con.printf("tpm: %s", m.tpm.describe())
	// The kernel runs /init only after every asynchronous probe of its built-in drivers has ended
	// (async_synchronize_full, SCSI scans and NVMe included), so only drivers loaded just now can
	// still be bringing disks up (USB disks enumerate later either way; no settle waits for them).
	if loaded > 0 {
		settleDevices()
	}
	m.phases.mark("devices")
	m.net = network.New(m.con.printf)
	m.net.SetMetadataInterface(metadataInterface(m.params[paramPlatform])) // who may route 169.254.0.0/16
	m.logDir = "/var/log"

	// The controllers take it from here: the boot-config controller reads kiln.config= or the
	// config drive while the platform controller fetches kiln.platform='s facts; the config
	// controller composes the config from both (config_controller.go) and puts its install
	// section, from which the volumes controller sets the disks up; the network and hostname
	// controllers apply the config as it is put, and again whatever the kept config changes of it.
	m.startControllers(m.net)
	m.awaitInstall()
	m.phases.mark("config")
	vol := m.awaitVolumes()
	m.slots = findSlots(m.params[paramSlot], vol.Disk, disk.ListBlockDevices("/sys"))
	version := m.awaitConfig() // the kept config considered: the boot's config, final
	m.phases.mark("var")
	m.waitNetwork(version, 20*time.Second)
	m.phases.mark("network") // the wait for the network beyond /var, which ran beside it
	m.startClock()

	m.watchTrial()
	m.extensions, _ = m.awaitExtensions()
	if m.schematic = readSchematic(schematicFile); m.schematic != "" {
		m.con.printf("schematic %s", m.schematic)
	}
	m.startServices()
	m.awaitAPI()
	m.phases.mark("services")
	m.con.printf("boot: %s", m.phases.describe(uptime()))
	m.ready()
	switch m.params[paramTest] {
	case actionPoweroff:
		m.shutdown(actionPoweroff)
	case testCrash:
		// what a machined that dies after ready looks like: PID 1 gone, the kernel panics
		m.con.printf("test: machined exits after ready, as a crash would")
		os.Exit(1)
	}
	for action := range m.power {
		m.shutdown(action)
	}
}

// hasStatePartition says whether any disk has a STATE partition, where a config may be kept.
func hasStatePartition(devs []disk.BlockDev) bool {
	for _, b := range devs {
		if b.IsPartition() && b.PartName == "STATE" {
			return true
		}
	}
	return false
}

func kernelRelease() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return "unknown"
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

// settleDevices waits until the set of block devices stops changing (at most 2 s): drivers
// just loaded probe their disks asynchronously, and there is no udev to tell us when done.
func settleDevices() {
	count := func() int { entries, _ := os.ReadDir("/sys/class/block"); return len(entries) }
	last, stable := count(), 0
	for i := 0; i < 80 && stable < 4; i++ { // quiet for 100 ms, at most 2 s
		time.Sleep(25 * time.Millisecond)
		if n := count(); n == last {
			stable++
		} else {
			last, stable = n, 0
		}
	}
}

// readBootConfig reads the machine config from kiln.config= or a config drive (config/source).
// A broken one is reported and counts as none, with its problem: the machine then runs on what
// the other sources give, or on defaults, so it still comes up and can be reached to fix it.
func (m *machine) readBootConfig() sourceSpec {
	if value, ok := m.params[paramConfig]; ok && value != "" {
		if isURL(value) {
			m.net.Configure(network.NetworkConfig{}, 10*time.Second) // DHCP everywhere, to reach the URL
		}
		cfg, err := configFromParam(value, m.con.printf)
		if err != nil {
			m.con.printf("config: %v; using defaults", err)
			return sourceSpec{Problem: err.Error()}
		}
		source := configSourceName(value) // a URL without credentials or query
		m.con.printf("config: %s", source)
		return sourceSpec{Source: source, Config: cfg}
	}
	if dev, fstype := findConfigDrive("/sys"); dev != "" && m.configDriveAllowed(dev) {
		cfg, source, err := configFromDrive(dev, fstype)
		if err != nil {
			m.con.printf("config: %v; using defaults", err)
			return sourceSpec{Problem: err.Error()}
		}
		m.con.printf("config: %s", source)
		return sourceSpec{Source: source, Config: cfg}
	}
	return sourceSpec{}
}

// servicesWait bounds the boot's wait for the services controller to start the services (it
// waits for the extensions' services, which the boot has waited for already).
const servicesWait = 30 * time.Second

// startServices says the boot is starting the machine's services, and waits until the services
// controller has started them (services_live.go). It returns service/set as it found it.
func (m *machine) startServices() serviceSetSpec {
	m.enterStage(stageStarting, "")
	started := func(res resource.Resource) bool {
		set, ok := resource.SpecOf[serviceSetSpec](res)
		return ok && set.State != setWaiting
	}
	res, ok := m.awaitFor(serviceSetType, serviceSetID, servicesWait, started)
	if ok {
		set, _ := resource.SpecOf[serviceSetSpec](res)
		return set
	}
	res, _ = m.resources.Get(serviceSetType, serviceSetID)
	set, _ := resource.SpecOf[serviceSetSpec](res)
	m.con.printf("services: not started within %s (waiting for %s); going on", servicesWait, set.Reason)
	return set
}

// currentSupervisor is the supervisor running the services now, nil before there is one.
func (m *machine) currentSupervisor() *supervisor.Supervisor {
	m.supMu.Lock()
	defer m.supMu.Unlock()
	return m.sup
}

// setSupervisor hands the supervisor the services controller started to the API's readers.
func (m *machine) setSupervisor(sup *supervisor.Supervisor) {
	m.supMu.Lock()
	defer m.supMu.Unlock()
	m.sup = sup
}

// apiWait bounds the boot's wait for the API controller to start the API (a listen and a
// certificate check).
const apiWait = 30 * time.Second

// awaitAPI waits until the API controller has started the API the boot's config asks for, or
// found it off (api/status at the config's version; api_controller.go).
func (m *machine) awaitAPI() {
	config, _ := m.resources.Get(machineConfigType, machineConfigID)
	tried := func(res resource.Resource) bool { return statusVersion(res) >= config.Version }
	if _, ok := m.awaitFor(apiStatusType, apiStatusID, apiWait, tried); !ok {
		m.con.printf("api: not started within %s; going on", apiWait)
	}
}

// statusVersion is the config version api/status follows.
func statusVersion(res resource.Resource) uint64 {
	spec, _ := resource.SpecOf[apiStatusSpec](res)
	return spec.ConfigVersion
}

// openAPI starts an API serving this machine (a test may set live.serveAPI instead).
func (m *machine) openAPI(api APIConfig) (*apiServer, error) {
	if m.live.serveAPI != nil {
		return m.live.serveAPI(api)
	}
	return serveAPI(api, m, m.con.log)
}

// readyLine is the one line the boot harness waits for, exactly as the boot contract specifies it
// (tests match it whole); whether the API is on is said on the line before it.
func (m *machine) readyLine() string {
	r := m.readySpec()
	return fmt.Sprintf("machined ready: version=%s kernel=%s extensions=[%s] var=%s platform=%s",
		r.Version, r.Kernel, strings.Join(r.Extensions, ","), r.Var, r.Platform)
}

// readySpec is the ready line as a resource (machine/ready): what came up, from where.
type readySpec struct {
	Version    string   `json:"version"`
	Kernel     string   `json:"kernel"`
	Extensions []string `json:"extensions"`
	Var        string   `json:"var"`
	Platform   string   `json:"platform"`
}

func (m *machine) readySpec() readySpec {
	names := make([]string, len(m.extensions))
	for i, e := range m.extensions {
		names[i] = e.Name
	}
	return readySpec{Version: m.version, Kernel: m.kernel, Extensions: names, Var: m.volume().Var, Platform: m.fetchedPlatform().name()}
}

// publishReady puts the ready line's facts as the machine/ready resource, just before the line.
func (m *machine) publishReady() {
	if _, err := m.resources.Put(readyOwner, readyType, readyID, m.readySpec()); err != nil {
		m.con.printf("ready: %v", err)
	}
}

// watchTrial reboots a trial boot that does not reach ready in time, so that GRUB counts the
// next try (and, with none left, falls back) without anyone acting: a slot that hangs must
// not strand the machine any more than one that panics.
func (m *machine) watchTrial() {
	if m.slots == nil {
		m.slots = &slots{}
	}
	if line := m.slots.describe(); line != "" {
		m.con.printf("%s", line)
	}
	if m.slots.bootedAs() != "trial" || !m.pid1 {
		return
	}
	limit := trialTimeout(m.params)
	safego.Go("trial deadline", func() {
		select {
		case <-m.isReady:
		case <-time.After(limit):
			m.con.printf("boot: slot %s did not reach ready within %s; rebooting for the next try", m.slots.slot, limit)
			syscall.Sync()
			_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
		}
	})
}

func (m *machine) ready() {
	// ready means config applied and services started. A trial slot that cannot be healthy
	// (trial.go) reboots before the ready line; one that can becomes the default once its
	// health has held for the grace period (health.go)
	if m.slots.bootedAs() == "trial" {
		if problems := m.trialProblems(); len(problems) > 0 {
			m.failTrial(problems)
			return
		}
	}
	m.readyAt = time.Now()
	if m.slots.bootedAs() == "trial" {
		m.con.printf("boot: slot %s becomes the default once healthy for %s", m.slots.slot, trialGrace(m.params))
	}
	if m.isReady != nil { // the health and trial controllers start judging once it is closed and machine/ready is out
		close(m.isReady)
	}
	if addr := m.runningAPI().addr; addr != "" {
		m.con.printf("api: listening on %s (mutual TLS)", addr)
	} else {
		m.con.printf("api: off (no api certificates in the machine config)")
	}
	m.publishReady()
	m.enterStage(stageRunning, "")
	m.con.line(m.readyLine()) // the platform controller now sends the platform its ready report
}

// startClock keeps the clock in sync, from the config's servers, else the platform's time
// service, else DHCP's (which may arrive after the first lease: they are looked for again).
func (m *machine) startClock() {
	if m.cfg.Time.Disabled {
		m.con.printf("time: sync is off (time.disabled)")
		return
	}
	chosen := func() []string { return m.chooseTimeServers(m.runningConfig().Time.Servers) }
	clock := ntp.New(chosen(), m.con.printf)
	m.live.clockMu.Lock()
	m.clock = clock // the time controller reads it (config_live.go)
	m.live.clockMu.Unlock()
	safego.Go("time sync", func() { clock.Run(context.Background()) })
	safego.Go("time servers", func() {
		for range time.Tick(30 * time.Second) {
			clock.SetServers(chosen())
		}
	})
}

// The API's view of the machine (apiBackend).

func (m *machine) Status() interface{} {
	hostname, _ := os.Hostname()
	var addrs map[string][]string
	var leases map[string]network.LeaseInfo
	if m.net != nil {
		addrs, leases = kernelAddresses(), m.net.Leases()
	}
	return map[string]interface{}{
		"version":        m.version,
		"kernel":         m.kernel,
		"hostname":       hostname,
		"uptime_seconds": int(time.Since(m.started).Seconds()),
		"extensions":     m.extensions,
		"schematic":      m.schematic,
		"var":            m.volume().Var,
		"config":         m.configSource,
		"addresses":      addrs,
		"leases":         leases,
		"services":       m.Services(),
		"boot":           m.slots.status(),
		"upgrade":        m.upgrades.snapshot(),
		"platform":       m.platformStatus(),
		"time":           m.timeStatus(),
		"firmware":       m.firmware,
		"lockdown":       m.lockdown,
		"tpm":            m.tpm,
		"modules":        loadedModules(modulesFile),
	}
}

// kernelAddresses is every address the kernel has on each interface but lo: what machined set,
// what DHCP gave, and what the kernel made itself (IPv6 SLAAC and link-local addresses).
func kernelAddresses() map[string][]string {
	out := map[string][]string{}
	links, addresses, err := readKernelLinks()
	if err != nil {
		return out
	}
	loopback := map[string]bool{}
	for _, l := range links {
		loopback[l.Name] = l.Loopback
	}
	for _, a := range addresses {
		if !loopback[a.Interface] {
			out[a.Interface] = append(out[a.Interface], a.Address)
		}
	}
	return out
}

// platformStatus is /v1/status's platform section: platform/metadata as the API shows it.
func (m *machine) platformStatus() map[string]interface{} {
	spec, _ := m.platformMetadata()
	return spec.fetched.status(spec.report)
}

// runningAPI is the API the API controller runs (zero before, or when it is off).
func (m *machine) runningAPI() runningAPI {
	m.live.apiMu.Lock()
	defer m.live.apiMu.Unlock()
	return m.live.api
}

// setRunningAPI is how the API controller says what runs.
func (m *machine) setRunningAPI(api runningAPI) {
	m.live.apiMu.Lock()
	defer m.live.apiMu.Unlock()
	m.live.api = api
}

func (m *machine) timeStatus() interface{} {
	m.live.clockMu.Lock()
	clock := m.clock
	m.live.clockMu.Unlock()
	if clock == nil {
		return map[string]interface{}{"synced": false, "error": "time sync is off"}
	}
	return clock.Status()
}

// rollBack puts the other slot on trial (the rollback controller runs it, rollback.go). It waits
// for no upgrade: while one is under way (or done and rebooting) it is refused, since both write
// the boot state, and the upgrade's check of the default slot runs under the same lock.
func (m *machine) rollBack() (string, error) {
	m.upgrades.mu.Lock()
	defer m.upgrades.mu.Unlock()
	if s := m.upgrades.status; s != nil && s.State != upgradeFailed {
		err := fmt.Errorf("an upgrade is %s; roll back once it is over", s.State)
		m.con.printf("rollback: %v", err)
		return "", err
	}
	slot, err := m.slots.rollback()
	if err != nil {
		m.con.printf("rollback: %v", err)
		return "", err
	}
	m.con.printf("rollback: slot %s is on trial now; rebooting", slot)
	return slot, nil
}

func (m *machine) Services() []supervisor.ServiceStatus {
	sup := m.currentSupervisor()
	if sup == nil {
		return []supervisor.ServiceStatus{}
	}
	return sup.Status()
}

func (m *machine) Logs(name string) ([]string, bool) {
	if name == "machined" {
		return m.con.log.Lines(), true
	}
	sup := m.currentSupervisor()
	if sup == nil {
		return nil, false
	}
	return sup.Logs(name)
}

func (m *machine) Power(action string) { m.power <- action }
