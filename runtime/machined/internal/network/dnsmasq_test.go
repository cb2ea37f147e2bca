package network

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/testkit"
)

// vethPair makes two network namespaces named after prefix and the test's PID (parallel runs
// never collide), removed when the test ends, joined by a veth pair: vs0 in the server's, vc0
// in the client's.
func vethPair(t *testing.T, ip, prefix string) (srv, cli string) {
	tag := fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)
	srv, cli = tag+"s", tag+"c"
	for _, ns := range []string{srv, cli} {
		if out, err := exec.Command(ip, "netns", "add", ns).CombinedOutput(); err != nil {
			testkit.Unavailable(t, "no named network namespaces here (%v): %s", err, out)
		}
		ns := ns
		t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", ns).Run() })
	}
	mustRun(t, ip, "-n", srv, "link", "add", "vs0", "type", "veth", "peer", "name", "vc0", "netns", cli)
	return srv, cli
}

// runClientHelper runs the client half of a test, the test helper of this binary, inside the
// client's namespace cli with env (the helper's interface variable) set to vc0, and fails the
// test, showing dnsmasq's logs, unless it passes within timeout.
func runClientHelper(t *testing.T, ip, cli, helper, env string, timeout time.Duration, logs func() string) {
	t.Helper()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, ip, "netns", "exec", cli, os.Args[0], "-test.run=^"+helper+"$", "-test.v",
		fmt.Sprintf("-test.timeout=%s", timeout))
	cmd.Env = append(os.Environ(), env+"=vc0")
	out, err := cmd.CombinedOutput()
	t.Logf("client (%s):\n%s", time.Since(began).Round(time.Millisecond), out)
	if err != nil || !bytes.Contains(out, []byte("--- PASS: "+helper)) {
		t.Fatalf("the client in the namespace failed: %v\ndnsmasq:\n%s", err, logs())
	}
}

// helperIface names the interface TestDnsmasqClientHelper runs DHCP on; it is set only when
// TestDHCPAgainstDnsmasq runs this test binary again inside the client's namespace.
const helperIface = "KILN_DNSMASQ_HELPER_IFACE"

// TestDHCPAgainstDnsmasq runs machined's DHCP client against a real server: dnsmasq in one
// network namespace, the client in another, a veth pair between them. The server hands out
// a /32 with classless routes to a gateway outside it (Google Compute Engine's layout), an
// MTU, an NTP server and T1/T2 of 4/8 s so a renewal comes within seconds. The client runs
// in a re-executed test binary, since a namespace belongs to a thread and the client's
// goroutines run on any thread of the process.
func TestDHCPAgainstDnsmasq(t *testing.T) {
	ip, dnsmasq := needNetnsTools(t)
	srv, cli := vethPair(t, ip, "kiln")
	mustRun(t, ip, "-n", srv, "addr", "add", "10.9.0.1/24", "dev", "vs0")
	mustRun(t, ip, "-n", srv, "link", "set", "vs0", "up")
	logs := startDnsmasq(t, ip, dnsmasq, srv,
		// dnsmasq wants a range inside the interface's subnet; the netmask option makes it a /32
		"--dhcp-range=10.9.0.50,10.9.0.50,2m",
		"--dhcp-option=option:netmask,255.255.255.255",
		"--dhcp-option=option:router,10.9.0.1", // ignored: the classless routes win
		"--dhcp-option=option:classless-static-route,10.9.0.1/32,0.0.0.0,0.0.0.0/0,10.9.0.1,192.0.2.0/24,10.9.0.1",
		"--dhcp-option=option:mtu,1400",
		"--dhcp-option=option:ntp-server,10.9.0.1",
		"--dhcp-option=option:domain-name,kiln.test",
		"--dhcp-option=option:T1,4",
		"--dhcp-option=option:T2,8")

	runClientHelper(t, ip, cli, "TestDnsmasqClientHelper", helperIface, 40*time.Second, logs)

	// what the client left in the kernel, read back from the client's namespace
	routes := mustRun(t, ip, "-n", cli, "-4", "route", "show", "dev", "vc0")
	for _, want := range []string{"default via 10.9.0.1 proto dhcp", "10.9.0.1 proto dhcp scope link", "192.0.2.0/24 via 10.9.0.1 proto dhcp"} {
		if !strings.Contains(routes, want) {
			t.Errorf("no route %q in:\n%s", want, routes)
		}
	}
	if addr := mustRun(t, ip, "-n", cli, "-4", "addr", "show", "dev", "vc0"); !strings.Contains(addr, "inet 10.9.0.50/32") {
		t.Errorf("no 10.9.0.50/32:\n%s", addr)
	}
	if link := mustRun(t, ip, "-n", cli, "link", "show", "dev", "vc0"); !strings.Contains(link, "mtu 1400") {
		t.Errorf("MTU not set:\n%s", link)
	}
	// the first ACK is broadcast (the client has no address yet), a renewal's goes to ciaddr
	log := logs()
	acks, offers := strings.Count(log, "DHCPACK(vs0) 10.9.0.50"), strings.Count(log, "DHCPOFFER(vs0)")
	if unicast := acks + offers - strings.Count(log, "broadcast response"); acks < 2 || unicast < 1 {
		t.Errorf("dnsmasq acknowledged %d requests, %d unicast: want the lease and a unicast renewal:\n%s", acks, unicast, log)
	}
}

// TestDnsmasqClientHelper is the client half of TestDHCPAgainstDnsmasq, run inside the
// client's namespace: it brings the interface up with DHCP as machined does and waits for
// the lease and its first renewal.
func TestDnsmasqClientHelper(t *testing.T) {
	ifname := os.Getenv(helperIface)
	if ifname == "" {
		t.Skip("run by TestDHCPAgainstDnsmasq inside its network namespace")
	}
	n := New(t.Logf)
	n.resolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	n.Configure(NetworkConfig{Interfaces: []InterfaceConfig{{Name: ifname}}}, 10*time.Second)
	if got := n.Addresses()[ifname]; !reflect.DeepEqual(got, []string{"10.9.0.50/32"}) {
		t.Fatalf("addresses after Configure: %v", got)
	}
	began := time.Now()
	waitFor(t, 20*time.Second, "a renewal", func() bool { return n.Leases()[ifname].Renewals >= 1 })
	t.Logf("renewed %s after the first lease", time.Since(began).Round(time.Millisecond))
	li := n.Leases()[ifname]
	want := []RouteConfig{{To: "10.9.0.1/32"}, {To: "0.0.0.0/0", Via: "10.9.0.1"}, {To: "192.0.2.0/24", Via: "10.9.0.1"}}
	if li.Address != "10.9.0.50/32" || li.MTU != 1400 || li.Router != "" || !reflect.DeepEqual(li.Routes, want) ||
		li.Domain != "kiln.test" || li.LeaseSeconds != 120 || li.Server != "10.9.0.1" {
		t.Errorf("lease %+v", li)
	}
	if got := n.NTPServers(); !reflect.DeepEqual(got, []string{"10.9.0.1"}) {
		t.Errorf("NTP servers %v", got)
	}
}

// helperIface6 names the interface TestDnsmasqDHCP6ClientHelper runs DHCPv6 on.
const helperIface6 = "KILN_DNSMASQ6_HELPER_IFACE"

// TestDHCP6AgainstDnsmasq runs machined's DHCPv6 client against dnsmasq over a veth pair
// between two namespaces: SOLICIT, ADVERTISE, REQUEST, REPLY for a one-address range, the
// address put on the interface as a /128, and the DNS server the reply names. dnsmasq's
// T1 is half its shortest (two-minute) lease, so renewals are tested with a fake clock in
// internal/dhcp6 instead.
func TestDHCP6AgainstDnsmasq(t *testing.T) {
	ip, dnsmasq := needNetnsTools(t)
	srv, cli := vethPair(t, ip, "kiln6")
	mustRun(t, ip, "-n", srv, "addr", "add", "2001:db8:1::1/64", "dev", "vs0", "nodad")
	mustRun(t, ip, "-n", srv, "link", "set", "vs0", "up")
	logs := startDnsmasq(t, ip, dnsmasq, srv,
		"--dhcp-range=2001:db8:1::100,2001:db8:1::100,64,2m",
		"--dhcp-option=option6:dns-server,[2001:db8::53]")

	runClientHelper(t, ip, cli, "TestDnsmasqDHCP6ClientHelper", helperIface6, 25*time.Second, logs)
	if addr := mustRun(t, ip, "-n", cli, "-6", "addr", "show", "dev", "vc0"); !strings.Contains(addr, "inet6 2001:db8:1::100/128") {
		t.Errorf("no 2001:db8:1::100/128:\n%s", addr)
	}
	if log := logs(); !strings.Contains(log, "DHCPADVERTISE(vs0) 2001:db8:1::100") || !strings.Contains(log, "DHCPREPLY(vs0) 2001:db8:1::100") {
		t.Errorf("dnsmasq did not advertise and reply:\n%s", log)
	}
}

// TestDnsmasqDHCP6ClientHelper is the client half of TestDHCP6AgainstDnsmasq, run inside
// the client's namespace: DHCPv6 only, as configured with dhcp: false, dhcp6: true.
func TestDnsmasqDHCP6ClientHelper(t *testing.T) {
	ifname := os.Getenv(helperIface6)
	if ifname == "" {
		t.Skip("run by TestDHCP6AgainstDnsmasq inside its network namespace")
	}
	no, yes := false, true
	n := New(t.Logf)
	n.resolvConf = filepath.Join(t.TempDir(), "resolv.conf")
	began := time.Now()
	n.Configure(NetworkConfig{Interfaces: []InterfaceConfig{{Name: ifname, DHCP: &no, DHCP6: &yes}}}, 10*time.Second)
	if d := time.Since(began); d > time.Second {
		t.Errorf("Configure waited %s for DHCPv6", d)
	}
	// the client applies the address (its Bound hook) before it reports the bound state
	waitFor(t, 15*time.Second, "a DHCPv6 lease", func() bool {
		li := n.Leases()[ifname+"/dhcp6"]
		return li.Address != "" && li.State == "bound"
	})
	t.Logf("DHCPv6 lease %s after Configure", time.Since(began).Round(time.Millisecond))
	li := n.Leases()[ifname+"/dhcp6"]
	if li.Address != "2001:db8:1::100/128" || li.State != "bound" || li.LeaseSeconds != 120 || !reflect.DeepEqual(li.DNS, []string{"2001:db8::53"}) {
		t.Errorf("lease %+v", li)
	}
	if got := n.Addresses()[ifname]; !reflect.DeepEqual(got, []string{"2001:db8:1::100/128"}) {
		t.Errorf("addresses %v", got)
	}
	wantResolvConf(t, n, "nameserver 2001:db8::53\n")
}

// needNetnsTools skips unless the test runs as root with iproute2 and dnsmasq installed.
func needNetnsTools(t *testing.T) (ip, dnsmasq string) {
	t.Helper()
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root for network namespaces")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		testkit.Unavailable(t, "needs ip (iproute2) to set up network namespaces")
	}
	for _, p := range []string{"/usr/sbin/dnsmasq", "dnsmasq"} {
		if dnsmasq, err = exec.LookPath(p); err == nil {
			return ip, dnsmasq
		}
	}
	testkit.Unavailable(t, "needs dnsmasq (Debian: dnsmasq-base)")
	return "", ""
}

// startDnsmasq runs dnsmasq as a DHCP server only (no DNS) in namespace ns on vs0, until
// the test ends; it returns a function reading its log.
func startDnsmasq(t *testing.T, ip, dnsmasq, ns string, options ...string) func() string {
	t.Helper()
	dir := t.TempDir()
	logFile := filepath.Join(dir, "dnsmasq.log")
	args := append([]string{"netns", "exec", ns, dnsmasq, "--keep-in-foreground", "--conf-file=/dev/null", "--port=0",
		"--no-resolv", "--no-hosts", "--interface=vs0", "--bind-interfaces", "--no-ping", "--dhcp-authoritative", "--log-dhcp",
		"--log-facility=" + logFile, "--dhcp-leasefile=" + filepath.Join(dir, "leases"), "--pid-file=" + filepath.Join(dir, "pid"),
		"--user=root", "--group=root"}, options...)
	cmd := exec.Command(ip, args...)
	output, err := os.Create(filepath.Join(dir, "output"))
	if err != nil {
		t.Fatal(err)
	}
	defer output.Close()
	cmd.Stdout, cmd.Stderr = output, output
	if err := cmd.Start(); err != nil {
		t.Fatalf("dnsmasq: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	logs := func() string {
		data, _ := os.ReadFile(logFile)
		return string(data)
	}
	waitFor(t, 5*time.Second, "dnsmasq serving DHCP", func() bool {
		select {
		case <-exited:
			out, _ := os.ReadFile(output.Name())
			t.Fatalf("dnsmasq exited: %s\n%s", out, logs())
		default:
		}
		return strings.Contains(logs(), "IP range") // "DHCP, IP range" or "DHCPv6, IP range"
	})
	return logs
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// waitFor polls cond until it holds or the time is up.
func waitFor(t *testing.T, max time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(max)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %s", what, max)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
