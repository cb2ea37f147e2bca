package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/testkit/wait"
)

// runMainEnv makes the test binary run machined's main (TestMain), not the tests.
const runMainEnv = "MACHINED_TEST_RUN_MAIN"

// userMachined starts machined as an ordinary process (not PID 1) on config, with an extension
// service directory; its stdout lines arrive on the channel, its exit status on the other. It
// starts through the package's reaper, which another test may have running (it would reap
// machined before exec.Cmd.Wait could).
func userMachined(t *testing.T, config string) (*exec.Cmd, <-chan string, <-chan syscall.WaitStatus, string) {
	t.Helper()
	dir := t.TempDir()
	services, logs := filepath.Join(dir, "services"), filepath.Join(dir, "logs")
	for _, d := range []string{services, logs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ext := "name: ext\ncommand: /bin/sh\nargs: [-c, 'echo ext up; exec sleep 60']\nrestart: always\n"
	if err := os.WriteFile(filepath.Join(services, "ext.yaml"), []byte(ext), 0o644); err != nil {
		t.Fatal(err)
	}
	configPath := filepath.Join(dir, "kiln.yaml")
	if err := os.WriteFile(configPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-config", configPath, "-services", services, "-logdir", logs)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its services go with it, whatever happens
	out, exited, err := supervisor.Children().StartPiped(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	lines := make(chan string, 256)
	go func() {
		defer close(lines)
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
	}()
	return cmd, lines, exited, logs
}

// awaitLine reads lines until one holds text, and fails the test if none does in time.
func awaitLine(t *testing.T, lines <-chan string, text string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case line, open := <-lines:
			if !open {
				t.Fatalf("machined's output ended before %q", text)
			}
			if strings.Contains(line, text) {
				return
			}
		case <-deadline:
			t.Fatalf("no %q within 30 s", text)
		}
	}
}

// Not PID 1, machined runs the extension's services and the config's through the same
// controllers as a boot (the services controller starts them, with their log files), says
// ready, and stops them on SIGTERM.
func TestUserModeRunsTheServicesThroughTheControllers(t *testing.T) {
	cmd, lines, exited, logs := userMachined(t, "services:\n  - {name: own, command: /bin/sh, args: [-c, 'echo own up; exec sleep 60']}\n")
	awaitLine(t, lines, "machined ready: version=")
	for _, name := range []string{"ext", "own"} {
		wait.Until(t, name+"'s log", 15*time.Second, func() bool {
			data, _ := os.ReadFile(filepath.Join(logs, name+".log"))
			return strings.Contains(string(data), name+" up")
		})
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	awaitLine(t, lines, "services: stopping them all, as the machine stops")
	if status := waitExit(t, exited); !status.Exited() || status.ExitStatus() != 0 {
		t.Fatalf("machined after SIGTERM: %s", supervisor.DescribeExit(status))
	}
}

// A service set that cannot start (a service after one that is not defined) ends machined with
// exit code 2, after the services controller said why.
func TestUserModeExitsTwoWhenTheServicesCannotStart(t *testing.T) {
	_, lines, exited, _ := userMachined(t, "services:\n  - {name: lone, command: /bin/sh, args: [-c, 'exec sleep 60'], after: [nowhere]}\n")
	awaitLine(t, lines, `starts after "nowhere", which is not defined; none started`)
	if status := waitExit(t, exited); !status.Exited() || status.ExitStatus() != 2 {
		t.Fatalf("machined with services that cannot start: %s, want exit code 2", supervisor.DescribeExit(status))
	}
}

// waitExit waits at most 30 s for machined to exit, and fails the test if it does not.
func waitExit(t *testing.T, exited <-chan syscall.WaitStatus) syscall.WaitStatus {
	t.Helper()
	select {
	case status := <-exited:
		return status
	case <-time.After(30 * time.Second):
		t.Fatal("machined still runs 30 s later")
		return 0
	}
}
