package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/testkit"
)

// clientWith is an HTTPS client presenting c, trusting serverCA for the machine.
func clientWith(t testing.TB, serverCA *testCA, c issued) *http.Client {
	t.Helper()
	pair, err := tls.X509KeyPair([]byte(c.certPEM), []byte(c.keyPEM))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(serverCA.pem))
	return client(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}})
}

// authAPI is a served API with two CAs (what kiln secrets generate makes) and its log.
type authAPI struct {
	url                string
	serverCA, clientCA *testCA
	machine            issued
	log                *testkit.SyncBuffer
	backend            *fakeBackend
	server             *apiServer
}

func startAuthAPI(t *testing.T, limits apiLimits) *authAPI {
	t.Helper()
	fake := &fakeBackend{}
	a := serveAuthAPI(t, limits, fake)
	a.backend = fake
	return a
}

// serveAuthAPI serves backend (a machine, or a fake) as startAuthAPI does.
func serveAuthAPI(t *testing.T, limits apiLimits, backend apiBackend) *authAPI {
	t.Helper()
	a := &authAPI{serverCA: newTestCA(t, "machines CA"), clientCA: newTestCA(t, "clients CA"), log: &testkit.SyncBuffer{}}
	a.machine = a.serverCA.issueSpec(t, certSpec{name: "machine", usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, server: true})
	cfg := APIConfig{Listen: "127.0.0.1:0", ClientCA: a.clientCA.pem, Cert: a.machine.certPEM, Key: a.machine.keyPEM}
	server, err := serveAPIWith(cfg, limits, backend, a.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(server.stop)
	a.server, a.url = server, "https://"+server.addr.String()
	return a
}

func (a *authAPI) client(t testing.TB, role string) *http.Client {
	c := a.clientCA.issueSpec(t, certSpec{name: role + "-user", orgs: []string{role}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return clientWith(t, a.serverCA, c)
}

// do sends one request and returns its code and decoded JSON error, if any.
func do(t *testing.T, c *http.Client, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var answer struct {
		Error string `json:"error"`
	}
	_ = json.Unmarshal(data, &answer)
	return resp.StatusCode, answer.Error
}

// Every endpoint, and the least role that may use it: the table covers apiRoutes whole, so an
// endpoint added without a role test fails here.
var endpointRoles = []struct {
	method, path, body string
	need               role
}{
	{"GET", "/v1/status", "", roleReader},
	{"GET", "/v1/services", "", roleReader},
	{"GET", "/v1/logs?service=web", "", roleReader},
	{"GET", "/v1/resources?type=network/status", "", roleReader},
	{"POST", "/v1/reboot", "", roleOperator},
	{"POST", "/v1/rollback", "", roleOperator},
	{"POST", "/v1/upgrade", `{"image": "10.0.2.2:5000/kiln/installer:0.2.0"}`, roleOperator},
	{"POST", "/v1/upgrade", `{"image": "10.0.2.2:5000/kiln/installer:0.2.0", "preserve": false}`, roleAdmin},
	{"POST", "/v1/poweroff", "", roleAdmin},
	{"POST", "/v1/config?mode=dry_run", "hostname: node-1\n", roleAdmin},
}

func TestAPIEveryEndpointNeedsItsRole(t *testing.T) {
	covered := map[string]bool{}
	for _, e := range endpointRoles {
		covered[strings.SplitN(e.path, "?", 2)[0]] = true
	}
	for path := range apiRoutes {
		if !covered[path] {
			t.Errorf("%s has no role test", path)
		}
	}
	a := startAuthAPI(t, defaultAPILimits)
	for _, name := range []string{"reader", "operator", "admin"} {
		c, have := a.client(t, name), roleNames[name]
		for _, e := range endpointRoles {
			a.backend.mu.Lock()
			a.backend.upgrades = nil // each allowed upgrade is the first
			a.backend.mu.Unlock()
			code, msg := do(t, c, e.method, a.url+e.path, e.body)
			switch {
			case have < e.need && code != http.StatusForbidden:
				t.Errorf("%s: %s %s: %d, want 403", name, e.method, e.path, code)
			case have < e.need && !(strings.Contains(msg, "role "+name+" may not") && strings.Contains(msg, ": it needs ")):
				t.Errorf("%s: %s %s: error %q does not say which role it needs", name, e.method, e.path, msg)
			case have >= e.need && code >= 300:
				t.Errorf("%s: %s %s: %d %s, want success", name, e.method, e.path, code, msg)
			}
		}
		if code, _ := do(t, c, "GET", a.url+"/v2/nothing", ""); code != http.StatusNotFound {
			t.Errorf("%s: an unknown endpoint: %d, want 404", name, code)
		}
	}
	// the power actions run 200 ms after their answers: wait for the admin's poweroff (a
	// loaded machine, or the race detector, may take well longer than that)
	countPoweroffs := func() int {
		a.backend.mu.Lock()
		defer a.backend.mu.Unlock()
		return strings.Count(strings.Join(a.backend.actions, ","), "poweroff")
	}
	for deadline := time.Now().Add(10 * time.Second); countPoweroffs() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	a.backend.mu.Lock()
	defer a.backend.mu.Unlock()
	poweroffs := strings.Count(strings.Join(a.backend.actions, ","), "poweroff")
	if poweroffs != 1 {
		t.Errorf("power actions %v: want poweroff from admin only", a.backend.actions)
	}
	if !strings.Contains(a.log.String(), `refused "reader-user"`) {
		t.Errorf("refusals are not logged: %s", a.log.String())
	}
}

func TestAPIRefusesCertificatesThatAreNotClients(t *testing.T) {
	a := startAuthAPI(t, defaultAPILimits)
	client := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	for why, spec := range map[string]certSpec{
		"no clientAuth":                  {orgs: []string{"admin"}},
		"no clientAuth extended key":     {orgs: []string{"admin"}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}},
		"a server's too":                 {orgs: []string{"admin"}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}},
		"names 0 roles":                  {usages: client},
		"names 2 roles":                  {orgs: []string{"reader", "admin"}, usages: client},
		`"root" is not admin, operator`:  {orgs: []string{"root"}, usages: client},
		`"Admin" is not admin, operator`: {orgs: []string{"Admin"}, usages: client},
	} {
		spec.name = "odd"
		code, msg := do(t, clientWith(t, a.serverCA, a.clientCA.issueSpec(t, spec)), "GET", a.url+"/v1/status", "")
		if code != http.StatusForbidden || !strings.Contains(msg, why) {
			t.Errorf("%s: %d %q, want 403 saying so", why, code, msg)
		}
	}
}

// The finding this guards against: one CA for machines and clients (the old openssl recipe, no
// extended key usage), and a machine's own certificate and key, lifted from its config,
// presented as a client. The API must refuse it, whatever the certificate says of itself.
func TestAPIRefusesTheMachinesOwnKeyAsAClient(t *testing.T) {
	ca := newTestCA(t, "one CA")
	for what, usages := range map[string][]x509.ExtKeyUsage{
		"no extended key usage (openssl's default)": nil,
		"clientAuth and serverAuth":                 {x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	} {
		machine := ca.issueSpec(t, certSpec{name: "node-1", orgs: []string{"admin"}, usages: usages, server: true})
		var errLog testkit.SyncBuffer
		cfg := APIConfig{Listen: "127.0.0.1:0", CA: ca.pem, Cert: machine.certPEM, Key: machine.keyPEM} // the old field
		server, err := serveAPIWith(cfg, defaultAPILimits, &fakeBackend{}, &errLog)
		if err != nil {
			t.Fatal(err)
		}
		addr, stop := server.addr, server.stop
		code, msg := do(t, clientWith(t, ca, machine), "GET", "https://"+addr.String()+"/v1/status", "")
		if code != http.StatusForbidden || !strings.Contains(msg, "never a client") {
			t.Errorf("%s: the machine's own certificate as a client: %d %q, want 403", what, code, msg)
		}
		// another certificate for the same key is refused too
		again := ca.issueSpec(t, certSpec{name: "lifted", orgs: []string{"admin"}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, key: machine.key})
		if code, msg := do(t, clientWith(t, ca, again), "GET", "https://"+addr.String()+"/v1/status", ""); code != http.StatusForbidden || !strings.Contains(msg, "machine's own key") {
			t.Errorf("%s: a client certificate for the machine's key: %d %q, want 403", what, code, msg)
		}
		stop()
		if !strings.Contains(errLog.String(), "the client CA also signs this machine's certificate") {
			t.Errorf("%s: no warning about the shared CA: %q", what, errLog.String())
		}
	}
}

func TestAPIClientCAAndItsOlderName(t *testing.T) {
	machineCA, clientCA, other := newTestCA(t, "m"), newTestCA(t, "c"), newTestCA(t, "o")
	cert, key := machineCA.issue(t, "machine", true)
	good := []APIConfig{{ClientCA: clientCA.pem, Cert: cert, Key: key}, {CA: clientCA.pem, Cert: cert, Key: key}, {CA: clientCA.pem, ClientCA: clientCA.pem, Cert: cert, Key: key}}
	for i, cfg := range good {
		if _, err := cfg.tlsConfig(); err != nil {
			t.Errorf("config %d: %v", i, err)
		}
	}
	if _, err := (APIConfig{CA: other.pem, ClientCA: clientCA.pem, Cert: cert, Key: key}).tlsConfig(); err == nil || !strings.Contains(err.Error(), "older name of client_ca") {
		t.Errorf("ca and client_ca that differ: %v", err)
	}
	if _, err := (APIConfig{Cert: cert, Key: key}).tlsConfig(); err == nil || !strings.Contains(err.Error(), "client_ca, cert and key") {
		t.Errorf("no CA: %v", err)
	}
	doc := `{"api": {"client_ca": ` + jsonString(clientCA.pem) + `, "cert": ` + jsonString(cert) + `, "key": ` + jsonString(key) + `}}`
	cfg, err := parseConfig("c.json", []byte(doc), true)
	if err != nil || cfg.API.ClientCA == "" {
		t.Fatalf("client_ca in a config: %v", err)
	}
}

func jsonString(s string) string {
	data, _ := json.Marshal(s)
	return string(data)
}

// FuzzClientIdentity: any bytes that parse as a certificate get an identity or an error from
// clientIdentity, never a panic.
func FuzzClientIdentity(f *testing.F) {
	ca := newTestCA(f, "fuzz CA")
	for _, spec := range []certSpec{
		{name: "a", orgs: []string{"admin"}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{name: "b", orgs: []string{"reader", "x"}},
		{name: "c", usages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny, x509.ExtKeyUsageServerAuth}},
	} {
		f.Add(ca.issueSpec(f, spec).cert.Raw)
	}
	serverKey := ca.cert.RawSubjectPublicKeyInfo
	f.Fuzz(func(t *testing.T, der []byte) {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return
		}
		id, err := clientIdentity(cert, serverKey)
		if err == nil && (id.role == roleNone || len(cert.Subject.Organization) != 1) {
			t.Fatalf("accepted %+v from %v", id, cert.Subject)
		}
	})
}
