package platform

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// Malformed answers are errors naming the platform and the document, and never panics.
func TestMalformedAnswers(t *testing.T) {
	for _, tc := range []struct {
		platform, path, body string
		want                 []string
	}{
		{"digital-ocean", "/metadata/v1.json", `{"hostname": "x",`, []string{"digital-ocean: metadata/v1.json: invalid JSON"}},
		{"digital-ocean", "/metadata/v1.json", `{"hostname": {"a": 1}}`, []string{"digital-ocean: metadata/v1.json: invalid JSON", "want a string or a number"}},
		{"digital-ocean", "/metadata/v1.json", `{"interfaces": {"public": "eth0"}}`, []string{"digital-ocean: metadata/v1.json: invalid JSON"}},
		{"digital-ocean", "/metadata/v1.json", ``, []string{"digital-ocean: metadata/v1.json: empty document"}},
		{"digital-ocean", "/metadata/v1.json", `[1, 2]`, []string{"digital-ocean: metadata/v1.json: invalid JSON"}},
		{"vultr", "/v1.json", `{"interfaces": {"mac": "x"}}`, []string{"vultr: v1.json: invalid JSON"}},
		{"vultr", "/v1.json", "\x00\xff", []string{"vultr: v1.json: invalid JSON"}},
		{"openstack", "/openstack/latest/meta_data.json", `{"uuid": ["x"]}`, []string{"openstack: openstack/latest/meta_data.json: invalid JSON"}},
		{"openstack", "/openstack/latest/network_data.json", `{"links": 5}`, []string{"openstack: openstack/latest/network_data.json: invalid JSON"}},
		{"hcloud", "/hetzner/v1/metadata", "<html>gateway error</html>", []string{"hcloud: hetzner/v1/metadata: no hostname or instance-id"}},
		{"azure", "/metadata/instance", `{"compute": {"userData": "%%% not base64"}}`, []string{"azure: IMDS metadata/instance: compute.userData: not valid base64"}},
		{"azure", "/metadata/instance", `{"compute": []}`, []string{"azure: IMDS metadata/instance: invalid JSON"}},
	} {
		t.Run(tc.platform+tc.path, func(t *testing.T) {
			srv := serveDir(t, t.TempDir(), func(w http.ResponseWriter, r *http.Request) bool {
				if r.URL.Path == tc.path {
					_, _ = w.Write([]byte(tc.body))
					return false
				}
				if tc.path == "/openstack/latest/network_data.json" && r.URL.Path == "/openstack/latest/meta_data.json" {
					_, _ = w.Write([]byte(`{"uuid": "x"}`))
					return false
				}
				return true
			})
			_, err := mustLookup(t, tc.platform).Fetch(context.Background(), testEnv(srv.URL))
			wantErr(t, err, tc.want...)
		})
	}

	// documents from drives
	for _, tc := range []struct {
		platform string
		drive    *fakeDrive
		want     []string
	}{
		{"azure", &fakeDrive{fstype: "udf", files: map[string][]byte{"ovf-env.xml": []byte(
			`<Environment><ProvisioningSection><LinuxProvisioningConfigurationSet><CustomData>!!garbage!!</CustomData>` +
				`</LinuxProvisioningConfigurationSet></ProvisioningSection></Environment>`)}},
			[]string{"azure: ovf-env.xml: CustomData: not valid base64"}},
		{"azure", &fakeDrive{fstype: "udf", files: map[string][]byte{"ovf-env.xml": []byte(`<Environment><Provisioning`)}},
			[]string{"azure: ovf-env.xml: invalid XML"}},
		{"azure", &fakeDrive{fstype: "udf", files: map[string][]byte{"ovf-env.xml": []byte(`<html></html>`)}},
			[]string{"azure: ovf-env.xml: the root element is <html>"}},
		{"vmware", &fakeDrive{label: "OVF ENV", files: map[string][]byte{"OVF-ENV.XML": []byte(`not xml`)}},
			[]string{"vmware: ovf-env.xml: invalid XML"}},
		{"openstack", &fakeDrive{label: "config-2", files: map[string][]byte{osUser: []byte("x")}},
			[]string{"openstack: openstack/latest/meta_data.json: missing"}},
		{"nocloud", &fakeDrive{label: "cidata", files: map[string][]byte{"network-config": []byte("version: 1\nconfig: [\n")}},
			[]string{"nocloud: network-config:2"}},
		{"nocloud", &fakeDrive{label: "cidata", files: map[string][]byte{"network-config": []byte("version: 3\n")}},
			[]string{"nocloud: network-config: version \"3\" is not 1 or 2"}},
		{"nocloud", &fakeDrive{label: "cidata", files: map[string][]byte{"network-config": []byte("- just\n- a list\n")}},
			[]string{"nocloud: network-config: not a mapping"}},
		{"nocloud", &fakeDrive{label: "cidata", files: map[string][]byte{"user-data": make([]byte, MaxUserData+1)}},
			[]string{"nocloud", "user-data", "more than the"}},
	} {
		env := Env{ReadDrive: tc.drive.read}
		_, err := mustLookup(t, tc.platform).Fetch(context.Background(), env)
		wantErr(t, err, tc.want...)
	}
}

func TestGoalStateMalformed(t *testing.T) {
	for _, doc := range []string{
		``,
		`<GoalState><Incarnation>x</Incarnation></GoalState>`,
		`<GoalState><Incarnation>1</Incarnation><Container></Container></GoalState>`,
		`<GoalState><Incarnation>1</Incarnation><Container><ContainerId>c</ContainerId></Container></GoalState>`,
		`<GoalState><Incarnation>99999999999999999999999</Incarnation></GoalState>`,
	} {
		_, err := parseGoalState([]byte(doc))
		wantErr(t, err, "azure: WireServer goal state")
	}
	// values are escaped in the report, whatever the goal state held
	gs, err := parseGoalState([]byte(`<GoalState><Incarnation>2</Incarnation><Container><ContainerId>a&lt;b</ContainerId>` +
		`<RoleInstanceList><RoleInstance><InstanceId>i&amp;j</InstanceId></RoleInstance></RoleInstanceList></Container></GoalState>`))
	if err != nil {
		t.Fatal(err)
	}
	if report := string(healthReport(gs)); !strings.Contains(report, "<ContainerId>a&lt;b</ContainerId>") || !strings.Contains(report, "<InstanceId>i&amp;j</InstanceId>") {
		t.Errorf("report: %s", report)
	}
}

// Invalid values are dropped with a warning; the valid ones around them are kept.
func TestInvalidFieldsDropped(t *testing.T) {
	f, err := parseDigitalOcean([]byte(`{
		"droplet_id": 1e400,
		"hostname": "bad_host!",
		"interfaces": {"public": [
			{"mac": "04:01:2a:0f:2a:01",
			 "ipv4": {"ip_address": "999.1.1.1", "netmask": "255.255.255.0", "gateway": "104.131.0.1"},
			 "anchor_ipv4": {"ip_address": "10.17.0.5", "netmask": "255.0.255.0"},
			 "ipv6": {"ip_address": "2604:a880::1", "cidr": 200, "gateway": "not-an-ip"}},
			{"mac": "zz:zz", "ipv4": {"ip_address": "10.0.0.1", "netmask": "255.0.0.0"}},
			{"mac": "04:01:2a:0f:2a:03", "ipv4": {"ip_address": "10.1.0.1", "netmask": "8"}}
		]},
		"dns": {"nameservers": ["8.8.8.8", "dns.google", "8.8.8.8"]}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if f.Hostname != "" || f.InstanceID != "1e400" {
		t.Errorf("hostname %q, instance ID %q", f.Hostname, f.InstanceID)
	}
	want := &Network{
		Interfaces: []Interface{
			{MAC: "04:01:2a:0f:2a:01", Gateway: "104.131.0.1"},
			{MAC: "04:01:2a:0f:2a:03", Addresses: []string{"10.1.0.1/8"}},
		},
		Nameservers: []string{"8.8.8.8"},
	}
	if !reflect.DeepEqual(f.Network, want) {
		t.Errorf("network %+v", f.Network)
	}
	wantWarnings := []string{
		`digital-ocean: metadata/v1.json: hostname "bad_host!" is not a valid host name; dropped`,
		`digital-ocean: metadata/v1.json interfaces.public[0]: address "999.1.1.1" with netmask "255.255.255.0" is not valid; dropped`,
		`digital-ocean: metadata/v1.json interfaces.public[0]: address "10.17.0.5" with netmask "255.0.255.0" is not valid; dropped`,
		`digital-ocean: metadata/v1.json interfaces.public[0]: address "2604:a880::1" with netmask "200" is not valid; dropped`,
		`digital-ocean: metadata/v1.json interfaces.public[0]: gateway "not-an-ip" is not an IP address; dropped`,
		`digital-ocean: metadata/v1.json interfaces.public[1]: MAC "zz:zz" is not valid; interface dropped`,
		`digital-ocean: metadata/v1.json dns.nameservers: nameserver "dns.google" is not an IP address; dropped`,
	}
	if !reflect.DeepEqual(f.Warnings, wantWarnings) {
		t.Errorf("warnings:\n%s", strings.Join(f.Warnings, "\n"))
	}
}

func TestNetworkConfigEdges(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want *Network
	}{
		// DHCP only: nothing static to report
		{"version: 2\nethernets:\n  eth0:\n    dhcp4: true\n", nil},
		{"", nil},
		{"network:\n  version: 1\n  config: disabled\n", nil},
		// both forms of a v1 address; a huge MTU is dropped
		{"version: 1\nconfig:\n  - type: physical\n    name: eth0\n    mtu: 99999999999999999999999\n    subnets:\n" +
			"      - type: static\n        address: 10.0.0.2/24\n        netmask: 255.255.255.0\n" +
			"      - type: static\n        address: 10.0.1.2/24\n        netmask: 255.255.0.0\n",
			&Network{Interfaces: []Interface{{Name: "eth0", Addresses: []string{"10.0.0.2/24"}}}}},
		// a glob name does not name the interface; the MAC does
		{`{"version": 2, "ethernets": {"e": {"match": {"name": "en*", "macaddress": "52:54:00:00:00:01"}, "addresses": ["10.9.0.2/16"]}}}`,
			&Network{Interfaces: []Interface{{MAC: "52:54:00:00:00:01", Addresses: []string{"10.9.0.2/16"}}}}},
		// a route via another family, or to junk, is dropped
		{"version: 2\nethernets:\n  eth0:\n    addresses: [10.0.0.2/24]\n    routes:\n      - {to: 10.1.0.0/16, via: \"2001:db8::1\"}\n      - {to: junk, via: 10.0.0.1}\n",
			&Network{Interfaces: []Interface{{Name: "eth0", Addresses: []string{"10.0.0.2/24"}}}}},
	} {
		f := newFacts("nocloud")
		n, err := parseNetworkConfig(f, "network-config", []byte(tc.doc))
		if err != nil {
			t.Errorf("%q: %v", tc.doc, err)
			continue
		}
		if !reflect.DeepEqual(n, tc.want) {
			t.Errorf("%q: network %+v, want %+v (warnings %q)", tc.doc, n, tc.want, f.Warnings)
		}
	}
}

func TestTopLevelKeys(t *testing.T) {
	doc := []byte("# comment\n\x00junk line\nhostname: 'it''s' # c\ninstance-id: \"i-1\"\n  hostname: nested\n" +
		"hostname: second\nlist:\n- a\nblock: |\n  text\nempty:\nflow: [a]\nurl: http://x:80/\nkey:nospace\n")
	got := topLevelKeys(doc, "hostname", "instance-id", "block", "empty", "flow", "url", "key", "missing")
	want := map[string]string{"hostname": "it's", "instance-id": "i-1", "url": "http://x:80/"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	block := topLevelBlock([]byte("a: 1\nnet:\n  x: 1\n\n  y: [2]\nlist:\n- 1\nb: 2\n"), "net")
	if string(block) != "  x: 1\n\n  y: [2]\n" {
		t.Errorf("block %q", block)
	}
	if topLevelBlock([]byte("net: 1\n"), "net") != nil {
		t.Error("a one-line value is not a block")
	}
}

func TestHcloudBadNetworkConfigIsDropped(t *testing.T) {
	f, err := parseHcloudMetadata([]byte("hostname: h1\ninstance-id: 7\nnetwork-config:\n  config: [\n  version: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Hostname != "h1" || f.InstanceID != "7" || f.Network != nil || len(f.Warnings) != 1 ||
		!strings.Contains(f.Warnings[0], "network-config dropped") {
		t.Errorf("facts %+v", f.Facts)
	}
}
