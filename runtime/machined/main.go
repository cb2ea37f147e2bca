// Command machined is Kiln's machine daemon: PID 1 after Kiln's tiny init. It mounts what
// the system needs, loads drivers, reads the machine config, sets up the network and the
// disk it owns (STATE, EPHEMERAL at /var), supervises services and serves an mTLS API.
//
// Not as PID 1 it touches nothing on the host: `-once` prints the version's ready line
// (the package's build test), and otherwise it runs only the supervisor and the API from
// -config and -services, which is how to try services and the API on a workstation.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"kiln/machined/internal/network"
	"kiln/machined/internal/supervisor"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "install" {
		os.Exit(installMain(os.Args[2:], os.Stdout, os.Stderr)) // install.go; PID 1 even in a container
	}
	if len(os.Args) > 1 && os.Args[1] == sandboxCommand {
		os.Exit(sandboxMain(os.Args[2:], os.Stderr)) // upgrade_sandbox.go: an upgrade's installer
	}
	once := flag.Bool("once", false, "print the ready line and exit (for build tests)")
	configPath := flag.String("config", "", "machine config (not PID 1 only; PID 1 reads kiln.config=)")
	services := flag.String("services", servicesDir, "service definitions directory (not PID 1 only)")
	logDir := flag.String("logdir", "", "write <service>.log files here (not PID 1 only; default: memory only)")
	flag.Parse()
	if *once {
		fmt.Printf("machined ready: version=%s\n", version)
		return
	}
	m := &machine{pid1: os.Getpid() == 1, version: version, started: time.Now(), power: make(chan string, 4), isReady: make(chan struct{})}
	if m.pid1 {
		claimStdio()
		handleSignals(m.power, func(f string, a ...interface{}) {
			if m.con != nil {
				m.con.printf(f, a...)
			}
		})
		supervisor.Children() // reap orphans from the start
		m.extDirs = stacked
		m.boot() // never returns
		return
	}
	m.extDirs = extensionDirs{manifests: extensionsDir, services: *services}
	userMode(m, *configPath, *logDir)
}

// userMode runs the supervisor and the API of a config on an ordinary system.
func userMode(m *machine, configPath, logDir string) {
	m.con = &console{stdout: os.Stdout, log: supervisor.NewRingLog(2000, 256<<10)}
	handleSignals(m.power, m.con.printf)
	m.cfg = &Config{}
	if configPath != "" {
		data, err := os.ReadFile(configPath)
		if err == nil {
			m.cfg, err = parseConfig(configPath, data, true)
		}
		if err != nil {
			m.con.printf("config: %v", err)
			os.Exit(2)
		}
		m.configSource = configPath
	}
	m.kernel = kernelRelease()
	m.extensions = listExtensions(m.extDirs.manifests)
	m.logDir = logDir
	// the controllers of an ordinary system: no disks (var=none), no network changes, the
	// config is -config's (startControllers)
	m.startControllers(leaveNetwork{})
	m.awaitConfig()
	if set := m.startServices(); set.Problem != "" {
		os.Exit(2) // the services controller said why
	}
	m.awaitAPI()
	m.ready()
	m.shutdown(<-m.power)
}

// leaveNetwork is the network controller's applier on an ordinary system, whose network is not
// machined's to change.
type leaveNetwork struct{}

func (leaveNetwork) Apply(network.NetworkConfig, time.Duration) {}
