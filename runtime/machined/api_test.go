package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"kiln/machined/internal/supervisor"
)

type fakeBackend struct {
	mu          sync.Mutex
	actions     []string
	rollbackErr error
	upgrades    []upgradeRequest
}

// Upgrade answers like the machine: the request's own checks, then a conflict when asked.
func (f *fakeBackend) Upgrade(req upgradeRequest) (*upgradeStatus, error) {
	if err := req.check(); err != nil {
		return nil, &apiError{400, err.Error()}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.upgrades = append(f.upgrades, req)
	if len(f.upgrades) > 1 {
		return nil, &apiError{409, "an upgrade is already pulling"}
	}
	return &upgradeStatus{State: upgradePulling, Image: req.describe(), Slot: "B", Preserve: req.preserve()}, nil
}

func (f *fakeBackend) Rollback() (string, error) {
	if f.rollbackErr != nil {
		return "", f.rollbackErr
	}
	return "A", nil
}

func (f *fakeBackend) Status() interface{} { return map[string]string{"version": "test"} }

// ApplyConfig checks the config as the machine does and reports every section unchanged.
func (f *fakeBackend) ApplyConfig(req configRequest, answer func(*configReport)) error {
	if _, err := parseConfig("config", req.Doc, true); err != nil {
		return &apiError{400, err.Error()}
	}
	answer(&configReport{Mode: req.Mode, Sections: []sectionResult{}})
	return nil
}

func (f *fakeBackend) WatchResources(t, id string) (resourceWatch, error) {
	return nil, &apiError{409, "this machine keeps no resources (yet)"}
}
func (f *fakeBackend) Resources(t string) []apiResource {
	all := []apiResource{{Type: "config/machine", ID: "machine", Version: 2, Phase: "running", Owner: "config", Spec: map[string]string{"source": "x"}}}
	if t != "" && t != "config/machine" {
		return []apiResource{}
	}
	return all
}
func (f *fakeBackend) Services() []supervisor.ServiceStatus {
	return []supervisor.ServiceStatus{{Name: "web", State: supervisor.StateRunning, PID: 42, Restart: supervisor.RestartAlways}}
}
func (f *fakeBackend) Logs(name string) ([]string, bool) {
	if name != "web" {
		return nil, false
	}
	return []string{"line 1", "line 2"}, true
}
func (f *fakeBackend) Power(action string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = append(f.actions, action)
}

// startTestAPI serves the API with real mutual TLS on a loopback port.
func startTestAPI(t *testing.T) (url string, serverCA, clientCA *testCA, backend *fakeBackend) {
	serverCA, clientCA = newTestCA(t, "server CA"), newTestCA(t, "client CA")
	cert, key := serverCA.issue(t, "machine", true)
	backend = &fakeBackend{}
	var errLog bytes.Buffer
	server, err := serveAPI(APIConfig{Listen: "127.0.0.1:0", CA: clientCA.pem, Cert: cert, Key: key}, backend, &errLog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(server.stop)
	return "https://" + server.addr.String(), serverCA, clientCA, backend
}

func client(cfg *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
}

func TestAPIAcceptsTheRightClientCertificate(t *testing.T) {
	url, serverCA, clientCA, backend := startTestAPI(t)
	c := client(clientCA.clientTLS(t, serverCA, true))

	get := func(path string, wantCode int) map[string]interface{} {
		t.Helper()
		resp, err := c.Get(url + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != wantCode {
			body, _ := io.ReadAll(resp.Body)
			t.Fatalf("GET %s: %d %s, want %d", path, resp.StatusCode, body, wantCode)
		}
		var out map[string]interface{}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return out
	}
	if got := get("/v1/status", 200); got["version"] != "test" {
		t.Errorf("status: %v", got)
	}
	if got := get("/v1/services", 200); !strings.Contains(fmtJSON(t, got), `"name":"web"`) {
		t.Errorf("services: %v", got)
	}
	if got := get("/v1/logs?service=web", 200); fmtJSON(t, got["lines"]) != `["line 1","line 2"]` {
		t.Errorf("logs: %v", got)
	}
	get("/v1/logs?service=ghost", 404)
	get("/v1/logs", 400)
	get("/v1/reboot", 405) // power actions are POST only
	get("/v2/nothing", 404)

	for _, action := range []string{"reboot", "poweroff"} {
		resp, err := c.Post(url+"/v1/"+action, "application/json", nil)
		if err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("POST %s: %v %v", action, resp, err)
		}
		resp.Body.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		backend.mu.Lock()
		n := len(backend.actions)
		backend.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("power actions: %v", backend.actions)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// postJSON posts body to url and wants the answer's status to be want; it returns the answer.
func postJSON(t *testing.T, c *http.Client, url, body string, want int) map[string]interface{} {
	t.Helper()
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]interface{}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != want {
		t.Fatalf("POST %s %s: %d %v, want %d", url, body, resp.StatusCode, out, want)
	}
	return out
}

func TestAPIRollbackRebootsOnlyWhenTheStateChanged(t *testing.T) {
	url, serverCA, clientCA, backend := startTestAPI(t)
	c := client(clientCA.clientTLS(t, serverCA, true))
	post := func(want int) map[string]interface{} {
		t.Helper()
		return postJSON(t, c, url+"/v1/rollback", "", want)
	}
	backend.rollbackErr = errors.New("slot B holds no system to roll back to")
	if got := post(http.StatusConflict); got["error"] != "rollback: slot B holds no system to roll back to" {
		t.Fatalf("refused rollback: %v", got)
	}
	time.Sleep(300 * time.Millisecond)
	backend.mu.Lock()
	if len(backend.actions) != 0 {
		t.Fatalf("a refused rollback rebooted: %v", backend.actions)
	}
	backend.mu.Unlock()
	backend.rollbackErr = nil
	if got := post(http.StatusAccepted); got["slot"] != "A" {
		t.Fatalf("rollback: %v", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		backend.mu.Lock()
		actions := append([]string(nil), backend.actions...)
		backend.mu.Unlock()
		if len(actions) == 1 && actions[0] == "reboot" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a rollback: %v", actions)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAPIRefusesWithoutAClientCertificate(t *testing.T) {
	url, serverCA, clientCA, _ := startTestAPI(t)
	c := client(clientCA.clientTLS(t, serverCA, false))
	if resp, err := c.Get(url + "/v1/status"); err == nil {
		resp.Body.Close()
		t.Fatalf("a client without a certificate got %s", resp.Status)
	}
}

func TestAPIRefusesACertificateFromAnotherCA(t *testing.T) {
	url, serverCA, _, _ := startTestAPI(t)
	stranger := newTestCA(t, "another CA")
	c := client(stranger.clientTLS(t, serverCA, true))
	if resp, err := c.Get(url + "/v1/status"); err == nil {
		resp.Body.Close()
		t.Fatalf("a client with another CA's certificate got %s", resp.Status)
	}
}

func TestAPIOffWithoutCertificates(t *testing.T) {
	if (APIConfig{}).Enabled() {
		t.Fatal("an empty API config must leave the API off")
	}
	m := withVolume(t, &machine{version: "v1", kernel: "6.1", extensions: []Extension{{Name: "a"}, {Name: "b"}}}, volumeSpec{Var: "tmpfs"})
	if got := m.readyLine(); got != "machined ready: version=v1 kernel=6.1 extensions=[a,b] var=tmpfs platform=metal" {
		t.Fatalf("ready line: %q", got)
	}
}

func TestAPIUpgradeStartsOneAndRefusesWhatIsWrong(t *testing.T) {
	url, serverCA, clientCA, backend := startTestAPI(t)
	c := client(clientCA.clientTLS(t, serverCA, true))
	post := func(body string, want int) map[string]interface{} {
		t.Helper()
		return postJSON(t, c, url+"/v1/upgrade", body, want)
	}
	for body, why := range map[string]string{
		`{"image": "10.0.2.2:5000/kiln/installer:0.2.0", "tag": "x"}`:   "unknown field",
		`{"image": "a/b", "url": "https://x/i.tar"}`:                    "exactly one",
		`{"channel": "nightly", "repository": "10.0.2.2:5000/kiln"}`:    "want alpha, beta or stable",
		`{"url": "ftp://host/installer.tar"}`:                           "http(s) URL",
		`{"url": "https://host/installer.tar", "digest": "sha256:abc"}`: "64 hex",
		`not json`: "upgrade request",
	} {
		got := post(body, http.StatusBadRequest)
		if msg, _ := got["error"].(string); !strings.Contains(msg, why) {
			t.Errorf("%s: error %q does not say %q", body, msg, why)
		}
	}
	got := post(`{"image": "10.0.2.2:5000/kiln/installer:0.2.0", "preserve": false}`, http.StatusAccepted)
	up, _ := got["upgrade"].(map[string]interface{})
	if up["state"] != "pulling" || up["slot"] != "B" || up["preserve"] != false {
		t.Fatalf("started upgrade: %v", got)
	}
	post(`{"channel": "stable", "repository": "10.0.2.2:5000/kiln/installer"}`, http.StatusConflict)
	if len(backend.upgrades) != 2 || backend.upgrades[0].Image != "10.0.2.2:5000/kiln/installer:0.2.0" {
		t.Fatalf("requests reaching the machine: %+v", backend.upgrades)
	}
}
