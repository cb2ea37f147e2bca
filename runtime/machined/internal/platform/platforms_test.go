package platform

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/xml"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func config(platform string) []byte {
	return []byte("# kiln machine config, as the user passed it to " + platform +
		"\nversion: 1\nservices:\n  - name: web\n    command: /usr/local/bin/web\n")
}

func TestLookup(t *testing.T) {
	_, err := Lookup("openstak")
	wantErr(t, err, `unknown platform "openstak"`, "aws, azure, digital-ocean, gcp, hcloud, metal, nocloud, openstack, vmware, vultr")
	for _, name := range append(Names(), "") {
		p, err := Lookup(name)
		if err != nil {
			t.Fatalf("Lookup(%q): %v", name, err)
		}
		if name != "" && p.Name() != name {
			t.Errorf("Lookup(%q).Name() = %q", name, p.Name())
		}
	}
	for _, name := range []string{"", "metal"} {
		start := time.Now()
		facts := fetch(t, name, Env{BaseURL: "http://192.0.2.1"}) // would hang if it asked anything
		wantFacts(t, facts, Facts{Platform: "metal", Source: "metal: no metadata service"})
		// a question to 192.0.2.1 would wait out the 3 s dial timeout; 1 s leaves room for a
		// loaded machine and the race detector
		if time.Since(start) > time.Second {
			t.Errorf("metal took %v", time.Since(start))
		}
	}
}

// awsServer is a strict IMDSv2: GETs without the token it handed out are 401.
func awsServer(t *testing.T, dir string) (*httptest.Server, *int) {
	const token = "AQAEAKbDV6FtO9-test-token=="
	puts := 0
	srv := serveDir(t, dir, func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodPut && r.URL.Path == "/latest/api/token" {
			if r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
				http.Error(w, "missing TTL", http.StatusBadRequest)
				return false
			}
			puts++
			_, _ = w.Write([]byte(token))
			return false
		}
		if r.Header.Get("X-aws-ec2-metadata-token") != token {
			w.WriteHeader(http.StatusUnauthorized)
			return false
		}
		return true
	})
	return srv, &puts
}

func TestAWS(t *testing.T) {
	srv, puts := awsServer(t, "testdata/aws")
	// the fake really requires the token
	resp, err := http.Get(srv.URL + "/latest/meta-data/instance-id")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a GET without token got %d", resp.StatusCode)
	}
	facts := fetch(t, "aws", testEnv(srv.URL))
	wantFacts(t, facts, Facts{
		Platform:   "aws",
		UserData:   config("aws"),
		Hostname:   "ip-10-0-1-23.ec2.internal",
		InstanceID: "i-0123456789abcdef0",
		Source:     "aws IMDSv2 " + srv.URL,
	})
	if *puts != 1 {
		t.Errorf("%d token requests, want 1", *puts)
	}
}

func TestAWSNoUserData(t *testing.T) {
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"latest/meta-data/local-hostname": "ip-10-0-1-24.ec2.internal\n", // hostname absent: local-hostname is used
		"latest/meta-data/instance-id":    "i-0fedcba9876543210\n",
	})
	srv, _ := awsServer(t, dir)
	wantFacts(t, fetch(t, "aws", testEnv(srv.URL)), Facts{
		Platform:   "aws",
		Hostname:   "ip-10-0-1-24.ec2.internal",
		InstanceID: "i-0fedcba9876543210",
		Source:     "aws IMDSv2 " + srv.URL,
	})
}

func TestAWSRefusesIMDSv1(t *testing.T) {
	// an IMDSv1-only service: the token PUT is not allowed
	srv := serveDir(t, "testdata/aws", nil)
	_, err := mustLookup(t, "aws").Fetch(context.Background(), testEnv(srv.URL))
	wantErr(t, err, "aws: latest/api/token: HTTP 405", "AllowIMDSv1")

	env := testEnv(srv.URL)
	env.AllowIMDSv1 = true
	wantFacts(t, fetch(t, "aws", env), Facts{
		Platform:   "aws",
		UserData:   config("aws"),
		Hostname:   "ip-10-0-1-23.ec2.internal",
		InstanceID: "i-0123456789abcdef0",
		Source:     "aws IMDSv1 " + srv.URL,
	})

	// opting in does not turn a missing service into IMDSv1: connection errors stay errors
	env = testEnv("http://127.0.0.1:1")
	env.AllowIMDSv1 = true
	_, err = mustLookup(t, "aws").Fetch(context.Background(), env)
	wantErr(t, err, "aws: latest/api/token")
}

func gcpServer(t *testing.T, dir string, flavor bool) *httptest.Server {
	return serveDir(t, dir, func(w http.ResponseWriter, r *http.Request) bool {
		if flavor {
			w.Header().Set("Metadata-Flavor", "Google")
		}
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "missing Metadata-Flavor", http.StatusForbidden)
			return false
		}
		return true
	})
}

func TestGCP(t *testing.T) {
	srv := gcpServer(t, "testdata/gcp", true)
	wantFacts(t, fetch(t, "gcp", testEnv(srv.URL)), Facts{
		Platform:   "gcp",
		UserData:   config("gcp"),
		Hostname:   "instance-1.us-central1-a.c.my-project.internal",
		InstanceID: "4520031799277581759",
		Source:     "gcp metadata server " + srv.URL,
	})

	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"computeMetadata/v1/instance/id": "17"})
	srv = gcpServer(t, dir, true) // no user-data attribute, no hostname: 404s
	wantFacts(t, fetch(t, "gcp", testEnv(srv.URL)), Facts{Platform: "gcp", InstanceID: "17", Source: "gcp metadata server " + srv.URL})
}

func TestGCPRefusesAnswerWithoutFlavor(t *testing.T) {
	srv := gcpServer(t, "testdata/gcp", false)
	_, err := mustLookup(t, "gcp").Fetch(context.Background(), testEnv(srv.URL))
	wantErr(t, err, "gcp: instance/attributes/user-data", "Metadata-Flavor: Google")
}

func azureIMDS(t *testing.T, doc string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metadata/instance" || r.URL.Query().Get("api-version") != "2021-02-01" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Metadata") != "true" {
			http.Error(w, `{"error":"Bad request. Required metadata header not specified"}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_, _ = w.Write(readTestdata(t, doc))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestAzure(t *testing.T) {
	srv := azureIMDS(t, "azure/imds-instance.json")
	drive := &fakeDrive{fstype: "udf", device: "/dev/sr0", files: map[string][]byte{"ovf-env.xml": readTestdata(t, "azure/ovf-env.xml")}}
	env := testEnv(srv.URL)
	env.ReadDrive = drive.read
	wantFacts(t, fetch(t, "azure", env), Facts{
		Platform:   "azure",
		UserData:   config("azure"),
		Hostname:   "kiln-azure-1",
		InstanceID: "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
		Source:     "azure provisioning DVD /dev/sr0 + IMDS " + srv.URL,
	})
	if len(drive.queries) != 1 || drive.queries[0].Files[0] != "ovf-env.xml" {
		t.Errorf("drive queries: %+v", drive.queries)
	}

	// without the DVD: the IMDS user data and computer name
	srv = azureIMDS(t, "azure/imds-instance-userdata.json")
	wantFacts(t, fetch(t, "azure", testEnv(srv.URL)), Facts{
		Platform:   "azure",
		UserData:   config("azure user data"),
		Hostname:   "kiln-azure-2",
		InstanceID: "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
		Source:     "azure IMDS " + srv.URL,
	})
}

func TestAzureReportReady(t *testing.T) {
	type healthReport struct {
		Incarnation string `xml:"GoalStateIncarnation"`
		Container   string `xml:"Container>ContainerId"`
		Roles       []struct {
			InstanceID string `xml:"InstanceId"`
			State      string `xml:"Health>State"`
		} `xml:"Container>RoleInstanceList>Role"`
	}
	var got []healthReport
	var contentType string
	wire := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("x-ms-version") != "2012-11-30" {
			http.Error(w, "version", http.StatusBadRequest)
			return
		}
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/machine" && r.URL.Query().Get("comp") == "goalstate":
			_, _ = w.Write(readTestdata(t, "azure/goalstate.xml"))
		case r.Method == http.MethodPost && r.URL.Path == "/machine" && r.URL.Query().Get("comp") == "health":
			var h healthReport
			if err := xml.NewDecoder(r.Body).Decode(&h); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			contentType = r.Header.Get("Content-Type")
			got = append(got, h)
		default:
			http.NotFound(w, r)
		}
	}))
	defer wire.Close()
	env := Env{WireServerURL: wire.URL, Sleep: func(time.Duration) {}, Deadline: 5 * time.Second}
	if err := mustLookup(t, "azure").ReportReady(context.Background(), env, Facts{Platform: "azure"}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("%d health reports", len(got))
	}
	h := got[0]
	if h.Incarnation != "3" || h.Container != "9d0e5a4e-0b5e-4e4a-8d0e-5e9b1c7f3a21" || len(h.Roles) != 1 ||
		h.Roles[0].InstanceID != "02aab8a4-74ef-476e-8182-f6d2ba4166a6.kiln-azure-1" || h.Roles[0].State != "Ready" {
		t.Errorf("health report: %+v", h)
	}
	if !strings.HasPrefix(contentType, "text/xml") {
		t.Errorf("Content-Type %q", contentType)
	}
	// the other platforms have nothing to report
	for _, name := range Names() {
		if name != "azure" {
			if err := mustLookup(t, name).ReportReady(context.Background(), Env{}, Facts{}); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}

func TestDigitalOcean(t *testing.T) {
	srv := serveDir(t, "testdata/digital-ocean", nil)
	wantFacts(t, fetch(t, "digital-ocean", testEnv(srv.URL)), Facts{
		Platform:   "digital-ocean",
		UserData:   config("digital-ocean"),
		Hostname:   "sample-droplet",
		InstanceID: "2756294",
		Network: &Network{
			Interfaces: []Interface{
				{
					MAC:       "04:01:2a:0f:2a:01",
					Addresses: []string{"104.131.20.105/18", "10.17.0.5/16", "2604:a880:800:10::17d:2001/64"},
					Gateway:   "104.131.0.1",
					Routes:    []Route{{To: "::/0", Via: "2604:a880:800:10::1"}},
				},
				{MAC: "04:01:2a:0f:2a:02", Addresses: []string{"10.132.255.113/16"}},
			},
			Nameservers: []string{"2001:4860:4860::8844", "2001:4860:4860::8888", "8.8.8.8"},
		},
		Source: "digital-ocean metadata " + srv.URL,
	})
}

func TestHcloud(t *testing.T) {
	srv := serveDir(t, "testdata/hcloud", nil)
	wantFacts(t, fetch(t, "hcloud", testEnv(srv.URL)), Facts{
		Platform:   "hcloud",
		UserData:   config("hcloud"),
		Hostname:   "kiln-hcloud-1",
		InstanceID: "42424242",
		Network: &Network{
			Interfaces: []Interface{{
				MAC:       "96:00:00:12:34:56",
				Name:      "eth0",
				Addresses: []string{"2a01:4f9:c010:1234::1/64"},
				Routes:    []Route{{To: "::/0", Via: "fe80::1"}},
				DHCP:      true,
			}},
			Nameservers: []string{"185.12.64.1", "185.12.64.2", "2a01:4ff:ff00::add:2", "2a01:4ff:ff00::add:1"},
		},
		Source: "hcloud metadata " + srv.URL,
	})
}

func TestVultr(t *testing.T) {
	srv := serveDir(t, "testdata/vultr", nil)
	wantFacts(t, fetch(t, "vultr", testEnv(srv.URL)), Facts{
		Platform:   "vultr",
		UserData:   config("vultr"),
		Hostname:   "vultr-guest",
		InstanceID: "a747bfz6385e",
		Network: &Network{Interfaces: []Interface{
			{MAC: "56:00:03:1b:4e:ca", Addresses: []string{"192.0.2.3/24", "2001:db8:0:1:5428:d5ff:fe28:1910/64"}, DHCP: true},
			{MAC: "5a:00:03:1b:4e:ca", Addresses: []string{"10.99.0.10/16"}},
		}},
		Source: "vultr metadata " + srv.URL,
	})
}

func openstackFacts(source string) Facts {
	return Facts{
		Platform:   "openstack",
		UserData:   config("openstack"),
		Hostname:   "kiln-os-1.novalocal",
		InstanceID: "d8e02d56-2648-49a3-bf97-6be8f1204f38",
		Network: &Network{
			Interfaces: []Interface{
				{MAC: "fa:16:3e:9c:bf:3d", DHCP: true},
				{
					MAC:       "fa:16:3e:2d:ec:cb",
					Addresses: []string{"10.0.0.5/24", "2001:db8:0:1::5/64"},
					Gateway:   "10.0.0.1",
					Routes:    []Route{{To: "192.168.10.0/24", Via: "10.0.0.254"}, {To: "::/0", Via: "2001:db8:0:1::1"}},
					MTU:       1450,
				},
			},
			Nameservers: []string{"10.0.0.2", "8.8.8.8"},
		},
		Source: source,
		Warnings: []string{
			"openstack: openstack/latest/network_data.json links[2]: vlan links are not supported; skipped",
			`openstack: openstack/latest/network_data.json networks[3]: link "vlan0" is not a usable link; skipped`,
		},
	}
}

func TestOpenStack(t *testing.T) {
	// the config drive first: no request is made
	drive := driveFromDir(t, "testdata/openstack", "CONFIG-2", "iso9660", "/dev/sr0")
	env := testEnv("http://127.0.0.1:1")
	env.ReadDrive = drive.read
	wantFacts(t, fetch(t, "openstack", env), openstackFacts("openstack config drive /dev/sr0"))

	// no drive: the metadata service
	srv := serveDir(t, "testdata/openstack", nil)
	env = testEnv(srv.URL)
	env.ReadDrive = (&fakeDrive{label: "cidata"}).read
	wantFacts(t, fetch(t, "openstack", env), openstackFacts("openstack metadata service "+srv.URL))
}

func TestVMware(t *testing.T) {
	drive := &fakeDrive{label: "OVF ENV", device: "/dev/sr0", files: map[string][]byte{"ovf-env.xml": readTestdata(t, "vmware/ovf-env.xml")}}
	env := Env{ReadDrive: drive.read}
	wantFacts(t, fetch(t, "vmware", env), Facts{
		Platform:   "vmware",
		UserData:   config("vmware"),
		Hostname:   "kiln-vmware-1",
		InstanceID: "vm-1042",
		Source:     "vmware OVF environment /dev/sr0",
	})
	wantFacts(t, fetch(t, "vmware", Env{}), Facts{Platform: "vmware", Source: "vmware: no OVF environment ISO (guestinfo is not read)"})

	// the encodings of guestinfo.kiln.config, and user-data
	plain := "hostname: x"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(plain))
	zw.Close()
	gzB64 := base64.StdEncoding.EncodeToString(gz.Bytes())
	for _, tc := range []struct{ props, want string }{
		{`<Property oe:key="guestinfo.kiln.config" oe:value="hostname: x"/>`, plain},
		{`<Property oe:key="guestinfo.kiln.config" oe:value="aG9zdG5hbWU6IHg="/><Property oe:key="guestinfo.kiln.config.encoding" oe:value="b64"/>`, plain},
		{`<Property oe:key="guestinfo.kiln.config" oe:value="` + gzB64 + `"/><Property oe:key="guestinfo.kiln.config.encoding" oe:value="gzip+base64"/>`, plain},
		{`<Property oe:key="user-data" oe:value="aG9zdG5hbWU6IHg="/>`, plain},
		{`<Property oe:key="user-data" oe:value=""/>`, ""},
	} {
		f, err := parseVMwareOVF([]byte(ovfEnv(tc.props)))
		if err != nil {
			t.Fatalf("%s: %v", tc.props, err)
		}
		if string(f.UserData) != tc.want || (tc.want == "" && f.UserData != nil) {
			t.Errorf("%s: user data %q, want %q", tc.props, f.UserData, tc.want)
		}
	}
	for _, props := range []string{
		`<Property oe:key="user-data" oe:value="not base64!"/>`,
		`<Property oe:key="guestinfo.kiln.config" oe:value="eA=="/><Property oe:key="guestinfo.kiln.config.encoding" oe:value="rot13"/>`,
		`<Property oe:key="guestinfo.kiln.config" oe:value="eA=="/><Property oe:key="guestinfo.kiln.config.encoding" oe:value="gz+b64"/>`,
	} {
		_, err := parseVMwareOVF([]byte(ovfEnv(props)))
		wantErr(t, err, "vmware: ovf-env.xml")
	}
}

func ovfEnv(props string) string {
	return `<?xml version="1.0" encoding="UTF-8"?><Environment xmlns="http://schemas.dmtf.org/ovf/environment/1" ` +
		`xmlns:oe="http://schemas.dmtf.org/ovf/environment/1" oe:id="kiln-1"><PropertySection>` + props + `</PropertySection></Environment>`
}

func TestNoCloud(t *testing.T) {
	drive := driveFromDir(t, "testdata/nocloud/v1", "CIDATA", "vfat", "/dev/vdb")
	wantFacts(t, fetch(t, "nocloud", Env{ReadDrive: drive.read}), Facts{
		Platform:   "nocloud",
		UserData:   config("nocloud"),
		Hostname:   "kiln-nocloud-1",
		InstanceID: "iid-kiln-01",
		Network: &Network{
			Interfaces: []Interface{
				{
					MAC:       "52:54:00:12:34:00",
					Name:      "eth0",
					Addresses: []string{"192.168.1.10/24", "2001:db8:1::10/64"},
					Gateway:   "192.168.1.1",
					Routes:    []Route{{To: "10.10.0.0/16", Via: "192.168.1.254"}, {To: "::/0", Via: "2001:db8:1::1"}},
					MTU:       1500,
				},
				{MAC: "52:54:00:12:34:01", Name: "eth1", DHCP: true},
			},
			Nameservers: []string{"192.168.1.1", "1.1.1.1", "9.9.9.9"},
		},
		Source: "nocloud drive /dev/vdb",
	})

	drive = driveFromDir(t, "testdata/nocloud/v2", "cidata", "iso9660", "/dev/sr0")
	wantFacts(t, fetch(t, "nocloud", Env{ReadDrive: drive.read}), Facts{
		Platform:   "nocloud",
		UserData:   config("nocloud"),
		Hostname:   "kiln-nocloud-2",
		InstanceID: "iid-kiln-02",
		Network: &Network{
			Interfaces: []Interface{
				{Name: "eth1", DHCP: true},
				{
					MAC:       "52:54:00:ab:cd:ef",
					Addresses: []string{"10.20.0.5/24", "2001:db8:20::5/64"},
					Gateway:   "10.20.0.1",
					Routes:    []Route{{To: "172.16.0.0/12", Via: "10.20.0.254"}, {To: "::/0", Via: "2001:db8:20::1"}},
					MTU:       9000,
				},
			},
			Nameservers: []string{"10.20.0.1", "2001:db8:20::1"},
		},
		Source: "nocloud drive /dev/sr0",
	})

	wantFacts(t, fetch(t, "nocloud", Env{}), Facts{Platform: "nocloud", Source: "nocloud: no cidata drive"})

	// a drive that cannot be read is an error, not "no drive"
	env := Env{ReadDrive: func(DriveQuery) (map[string][]byte, string, error) {
		return nil, "/dev/vdb", errors.New("mount: I/O error")
	}}
	_, err := mustLookup(t, "nocloud").Fetch(context.Background(), env)
	wantErr(t, err, "nocloud", "I/O error")
}
