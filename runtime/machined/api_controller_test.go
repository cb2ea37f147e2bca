package main

import (
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/resource"
	"kiln/machined/internal/testkit/wait"
)

// Before the boot starts the services the API controller starts no API and puts no api/status;
// an API that is off says so, at the config version it read.
func TestTheAPIControllerWaitsForTheBootAndSaysWhenTheAPIIsOff(t *testing.T) {
	state := resource.NewState()
	for typ, owner := range map[resource.Type]string{machineConfigType: configOwner, stageType: stageOwner} {
		if err := state.Claim(typ, owner); err != nil {
			t.Fatal(err)
		}
	}
	served := 0
	serve := func(APIConfig) (*apiServer, error) { served++; return nil, errors.New("not here") }
	ctrl := runCounted(t, state, &apiController{serve: serve, publish: func(runningAPI) {}, say: t.Logf})
	wait.Until(t, "the controller's first run", 5*time.Second, func() bool { return ctrl.count() >= 1 })
	runs := ctrl.count()
	if _, err := state.Put(configOwner, machineConfigType, machineConfigID, configSpec("test", &Config{})); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the controller's run for the config", 5*time.Second, func() bool { return ctrl.count() > runs })
	if _, ok := state.Get(apiStatusType, apiStatusID); ok {
		t.Fatal("api/status before the boot starts the services")
	}
	if _, err := state.Put(stageOwner, stageType, stageID, stageSpec{Stage: stageStarting}); err != nil {
		t.Fatal(err)
	}
	m := &machine{resources: state}
	wait.Until(t, "api/status", 5*time.Second, func() bool { return len(m.Resources("api")) == 1 })
	if got := m.Resources("api")[0].Spec; got != (apiStatusSpec{ConfigVersion: 1}) || served != 0 {
		t.Fatalf("api/status of an API that is off: %+v (served %d)", got, served)
	}
}

// The real API, as the boot has it: started by the controller on the config's address when the
// boot starts the services, answering a client over mutual TLS, and closed when the machine stops.
func TestTheAPIControllerStartsTheAPIAndStopsItWhenTheMachineStops(t *testing.T) {
	serverCA, clientCA := newTestCA(t, "machines CA"), newTestCA(t, "clients CA")
	cert := serverCA.issueSpec(t, certSpec{name: "machine", usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, server: true})
	api := APIConfig{Listen: "127.0.0.1:0", ClientCA: clientCA.pem, Cert: cert.certPEM, Key: cert.keyPEM}
	m := &machine{con: quietConsole(), cfg: &Config{API: api}, params: map[string]string{}, isReady: make(chan struct{})}
	m.startControllers(&applyRecorder{})
	m.awaitConfig()
	m.enterStage(stageStarting, "")
	m.awaitAPI()
	addr := m.runningAPI().addr
	if addr == "" {
		t.Fatalf("no API runs: %v", m.con.log.Lines())
	}
	reader := clientWith(t, serverCA, clientCA.issueSpec(t, certSpec{name: "reader-user", orgs: []string{"reader"}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}))
	resp, err := reader.Get("https://" + addr + "/v1/resources?type=api")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), addr) {
		t.Fatalf("GET /v1/resources?type=api: %d %s", resp.StatusCode, body)
	}
	m.stopServices(actionPoweroff)
	wait.Until(t, "the API closed", 5*time.Second, func() bool {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
		}
		return err != nil && m.runningAPI().addr == ""
	})
}
