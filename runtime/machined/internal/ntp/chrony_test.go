package ntp

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"kiln/machined/internal/testkit"
)

// startChronyd runs chronyd as an NTP server on 127.0.0.1 at local stratum 8, from a
// config in a temp dir (nothing read from /etc/chrony), with -x so it never touches the
// host's clock. It returns the server's address once chronyd answers.
func startChronyd(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("chronyd")
	if err != nil {
		bin = "/usr/sbin/chronyd"
		if _, err := os.Stat(bin); err != nil {
			testkit.Unavailable(t, "chronyd is not installed (Debian package chrony): the test against a real NTP server cannot run")
		}
	}
	dir := t.TempDir()
	l, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	port := l.LocalAddr().(*net.UDPAddr).Port
	l.Close()
	conf := filepath.Join(dir, "chrony.conf")
	text := fmt.Sprintf(`port %d
bindaddress 127.0.0.1
allow 127.0.0.1
local stratum %d
cmdport 0
bindcmdaddress /
driftfile %s
pidfile %s
`, port, chronyStratum, filepath.Join(dir, "drift"), filepath.Join(dir, "chronyd.pid"))
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// -x: never set the clock; -d: foreground, log to stderr; -t: exit on its own should
	// this test die without cleaning up. As root chronyd would drop to its own user,
	// which cannot read the temp dir; as anyone else it needs -U to start at all.
	args := []string{"-x", "-d", "-t", "60", "-f", conf}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root")
	} else {
		args = append(args, "-U")
	}
	cmd := exec.Command(bin, args...)
	var log testkit.SyncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := query(context.Background(), addr, time.Now, 200*time.Millisecond)
		if err == nil {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("chronyd did not answer within 10 s: %v\nchronyd log:\n%s", err, log.String())
		}
		select {
		case <-exited:
			t.Fatalf("chronyd exited: %v\nchronyd log:\n%s", cmd.ProcessState, log.String())
		case <-tick.C:
		}
	}
}

// chronyStratum is what chronyd reports to clients with "local stratum 8": the configured
// value itself (chrony.conf(5)), not one more.
const chronyStratum = 8

// TestChronyd checks the client against a real NTP server: the sample, then a Syncer
// (with a fake clock setter) reporting the sync.
func TestChronyd(t *testing.T) {
	start := time.Now()
	addr := startChronyd(t)
	t.Logf("chronyd answered after %v", time.Since(start))

	began := time.Now()
	s, err := Query(context.Background(), addr)
	took := time.Since(began)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sample: %+v (the query took %v)", s, took)
	// the round trip is at most the query's own time, however late a loaded machine runs either side
	if abs(s.Offset) > time.Second || s.Stratum != chronyStratum || s.Delay < 0 || s.Delay > took {
		t.Fatalf("implausible sample from chronyd: %+v", s)
	}

	// A Syncer whose (fake) clock is 30 s slow steps it, then merely slews.
	syncer, f := startSyncer(t, -30*time.Second, []string{addr})
	waitSynced(t, syncer)
	st := syncer.Status()
	if !st.Synced || st.Server != addr || st.Stratum != chronyStratum || st.OffsetMS < 29000 || st.OffsetMS > 31000 || st.LastSync == "" || st.Error != "" {
		t.Fatalf("status %+v", st)
	}
	expectWait(t, f, minPoll).fire()
	expectWait(t, f, 2*minPoll)
	steps, slews := f.calls()
	if len(steps) != 1 || abs(steps[0]-30*time.Second) > time.Second || len(slews) != 1 || abs(slews[0]) > StepThreshold {
		t.Fatalf("steps %v slews %v", steps, slews)
	}
	if st := syncer.Status(); abs(time.Duration(st.OffsetMS*1e6)) > time.Second {
		t.Fatalf("after the step: %+v", st)
	}
}
