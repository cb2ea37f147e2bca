package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kiln/machined/internal/network"
	"kiln/machined/internal/platform"
	"kiln/machined/internal/supervisor"
)

func TestDriveFilesAreRegularFilesUnderTheMountOnly(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "openstack", "latest"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("openstack/latest/meta_data.json", `{"uuid": "x"}`)
	write("user-data", "hostname: a\n")
	files, err := readFilesUnder(root, []string{"openstack/latest/meta_data.json", "user-data", "absent"}, 1024)
	if err != nil || string(files["openstack/latest/meta_data.json"]) != `{"uuid": "x"}` || len(files) != 2 {
		t.Fatalf("files %v, err %v", files, err)
	}
	if _, err := readFilesUnder(root, []string{"user-data"}, 5); err == nil || !strings.Contains(err.Error(), "more than 5 bytes") {
		t.Fatalf("an oversized file: %v", err)
	}
	// a hostile drive links a file (or a directory on the way) out of the mount
	if err := os.Symlink("/etc/shadow", filepath.Join(root, "meta-data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(root, "openstack", "link")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"meta-data", "openstack/link/passwd", "../x", "/etc/passwd"} {
		if _, err := readFilesUnder(root, []string{name}, 1024); err == nil {
			t.Errorf("%s: read through a link or out of the mount", name)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := readFilesUnder(root, []string{"dir"}, 1024); err == nil {
		t.Error("a directory read as a file")
	}
}

func TestPlatformNetworkMapsIPv4AndIPv6ByNameAndSkipsUnknownMACs(t *testing.T) {
	var said []string
	say := func(format string, args ...interface{}) { said = append(said, format) }
	got := platformInterfaces(&platform.Network{Interfaces: []platform.Interface{
		{Name: "eth0", Addresses: []string{"192.0.2.10/24", "2001:db8::10/64"}, Gateway: "192.0.2.1", MTU: 1460,
			Routes: []platform.Route{{To: "10.1.0.0/16", Via: "192.0.2.254"}, {To: "::/0", Via: "fe80::1"}}},
		{Name: "eth1", DHCP: true},
		{MAC: "02:00:00:00:00:99"},
	}}, say)
	if len(got) != 2 || len(said) != 1 {
		t.Fatalf("interfaces %+v, console %v", got, said)
	}
	eth0 := got[0]
	if eth0.Name != "eth0" || strings.Join(eth0.Addresses, ",") != "192.0.2.10/24,2001:db8::10/64" || eth0.Gateway != "192.0.2.1" ||
		eth0.MTU != 1460 || eth0.UsesDHCP() || eth0.UsesDHCP6() || len(eth0.Routes) != 2 || eth0.Routes[0].Via != "192.0.2.254" ||
		eth0.Routes[1] != (network.RouteConfig{To: "::/0", Via: "fe80::1"}) {
		t.Errorf("eth0: %+v", eth0)
	}
	if !got[1].UsesDHCP() {
		t.Errorf("eth1 must use DHCP: %+v", got[1])
	}
	cfg := network.NetworkConfig{Interfaces: got}
	if err := cfg.Validate(); err != nil {
		t.Errorf("the mapped network does not validate: %v", err)
	}
}

func TestPlatformUserDataIsTheConfigOnlyWhenNoneWasGiven(t *testing.T) {
	long := "ip-10-0-0-1." + strings.Repeat("long.", 14) + "internal"
	for _, tc := range []struct {
		platform, source, userData, hostname  string // source: where a config came from already
		wantSource, wantHostname, wantConsole string
	}{
		{"aws", "", "#cloud-config\nhostname: from-user-data\nruncmd: [x]\n", long, "aws:user-data", "from-user-data", ""},
		// a config from kiln.config= wins; the platform's long hostname is cut to its first label
		{"gcp", "kiln.config", "hostname: ignored\n", long, "kiln.config", "ip-10-0-0-1", ""},
		// user data that is not a valid config leaves the defaults, said on the console
		{"aws", "", "hostname: -bad-\n", "", "", "", "using defaults"},
	} {
		con := quietConsole()
		c := &configController{say: con.printf}
		got := c.compose(sourceSpec{Source: tc.source, Config: &Config{}}, &platformState{impl: mustLookup(t, tc.platform),
			facts: platform.Facts{UserData: []byte(tc.userData), Hostname: tc.hostname}})
		console := strings.Join(con.log.Lines(), "")
		if got.source != tc.wantSource || got.cfg.Hostname != tc.wantHostname || !strings.Contains(console, tc.wantConsole) {
			t.Errorf("%s user data %q: source %q hostname %q console %q", tc.platform, tc.userData, got.source, got.cfg.Hostname, console)
		}
	}
}

func TestReadyLineAndStatusNameThePlatform(t *testing.T) {
	m := withVolume(t, &machine{version: "v1", kernel: "6.1"}, volumeSpec{Var: "tmpfs"})
	withPlatform(t, m, &platformState{impl: mustLookup(t, "gcp")})
	if got := m.readyLine(); !strings.HasSuffix(got, " platform=gcp") {
		t.Fatalf("ready line: %q", got)
	}
	if (*platformState)(nil).name() != "metal" || m.platformStatus()["name"] != "gcp" {
		t.Fatal("platform status")
	}
}

// quietConsole keeps machined's lines in its log only (newConsole would write to the host's /dev/console).
func quietConsole() *console { return &console{log: supervisor.NewRingLog(100, 1<<16)} }

func mustLookup(t *testing.T, name string) platform.Platform {
	t.Helper()
	p, err := platform.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLinkLocalAddressesStayOutOfReservedRanges(t *testing.T) {
	seen := map[string]bool{}
	for _, mac := range []string{"52:54:00:12:34:56", "00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff", "02:00:00:00:a8:fe", "02:00:00:00:fe:fe"} {
		hw, _ := net.ParseMAC(mac)
		address := linkLocalFor(hw)
		ip, ipnet, err := net.ParseCIDR(address)
		if err != nil || ipnet.String() != "169.254.0.0/16" {
			t.Fatalf("%s: %s (%v)", mac, address, err)
		}
		v4 := ip.To4()
		if v4[2] == 0 || v4[2] == 255 || v4[2] == 169 || v4[3] == 0 || v4[3] == 255 {
			t.Errorf("%s: %s is reserved or the metadata /24", mac, address)
		}
		seen[address] = true
	}
	if len(seen) < 4 {
		t.Errorf("addresses do not follow the MAC: %v", seen)
	}
	cfg := network.NetworkConfig{Interfaces: []network.InterfaceConfig{{Name: "eth0", Addresses: []string{linkLocalFor(net.HardwareAddr{2, 0, 0, 0, 1, 2})}}}}
	if err := cfg.Validate(); err != nil {
		t.Errorf("the address does not validate: %v", err)
	}
}

func TestMetadataInterfaceOnlyWhereThereIsAMetadataService(t *testing.T) {
	primary, ok := primaryInterface()
	for _, name := range []string{"", "metal", "nocloud", "vmware", "no-such-cloud"} {
		if got := metadataInterface(name)(); got != "" {
			t.Errorf("%q: %q may route 169.254.0.0/16", name, got)
		}
	}
	for _, name := range []string{"aws", "azure", "openstack"} {
		if got := metadataInterface(name)(); ok && got != primary.Name || !ok && got != "" {
			t.Errorf("%q: %q, want the primary interface %q", name, got, primary.Name)
		}
	}
}
