package main

import (
	"os"
	"os/signal"
	"syscall"
	"time"

	"kiln/machined/internal/resource"
	"kiln/machined/internal/safego"
)

const (
	actionPoweroff = "poweroff"
	actionReboot   = "reboot"
)

// handleSignals routes signals: SIGTERM powers off, SIGINT reboots (the kernel sends
// SIGINT for Ctrl-Alt-Del once machined turns CAD off). Every other catchable signal is
// caught and ignored: as PID 1, Go's default action for many of them (SIGQUIT, SIGHUP,
// SIGUSR1...) would exit machined and panic the kernel.
func handleSignals(power chan<- string, say func(string, ...interface{})) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1,
		syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
		syscall.SIGPWR, syscall.SIGVTALRM, syscall.SIGPROF, syscall.SIGXCPU, syscall.SIGXFSZ)
	safego.Forever("signal handler", func() {
		for sig := range sigs {
			switch sig {
			case syscall.SIGTERM:
				power <- actionPoweroff
			case syscall.SIGINT:
				power <- actionReboot
			default:
				say("ignoring signal %v", sig)
			}
		}
	})
}

// shutdown stops services, ends every other process, syncs and unmounts the writable
// filesystems, then powers off or reboots. As PID 1 it never returns.
func (m *machine) shutdown(action string) {
	m.shutdownOnce.Do(func() {
		m.con.printf("%s: stopping services", action)
		m.stopServices(action) // the API controller stops the API too
		if !m.pid1 {
			os.Exit(0)
		}
		endProcesses(syscall.SIGTERM, 3*time.Second)
		endProcesses(syscall.SIGKILL, time.Second)
		syscall.Sync()
		for _, target := range []string{"/var", stateMount} {
			if _, ok := mountedAt(readMounts(), target); !ok {
				continue
			}
			_ = syscall.Mount("", target, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, "")
			if err := syscall.Unmount(target, 0); err != nil {
				_ = syscall.Unmount(target, syscall.MNT_DETACH)
			}
		}
		syscall.Sync()
		cmd := syscall.LINUX_REBOOT_CMD_POWER_OFF
		if action == actionReboot {
			cmd = syscall.LINUX_REBOOT_CMD_RESTART
		}
		m.con.printf("%s now", action)
		err := syscall.Reboot(cmd)
		m.con.printf("reboot(2) failed: %v", err)
		select {}
	})
}

// endProcesses signals every process but PID 1 and waits until none is left. Orphans are
// reparented to PID 1, so "no children" means nothing else runs.
func endProcesses(sig syscall.Signal, wait time.Duration) {
	_ = syscall.Kill(-1, sig)
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if _, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil); err == syscall.ECHILD {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fatal prints one clear line and reboots after a delay, as init does: a machine that
// cannot come up must say why and never hang silently.
func (m *machine) fatal(format string, args ...interface{}) {
	m.con.printf("fatal: "+format+"; rebooting in 10 s", args...)
	if !m.pid1 {
		os.Exit(1)
	}
	time.Sleep(10 * time.Second)
	syscall.Sync()
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_RESTART)
	select {}
}

// shutdownWait bounds the shutdown's wait for the services to stop: each has its stop timeout,
// and whatever is still running after it is killed with everything else.
const shutdownWait = 30 * time.Second

// stopServices says the machine is stopping, and waits until the services controller has
// stopped the services (services_live.go).
func (m *machine) stopServices(action string) {
	if m.resources == nil {
		return // no controllers, so no supervisor either
	}
	m.enterStage(stageStopping, action)
	stopped := func(res resource.Resource) bool {
		set, ok := resource.SpecOf[serviceSetSpec](res)
		return ok && set.State == setStopped
	}
	if _, ok := m.awaitFor(serviceSetType, serviceSetID, shutdownWait, stopped); !ok {
		m.con.printf("%s: the services did not stop within %s; ending them", action, shutdownWait)
	}
}
