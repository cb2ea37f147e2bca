package main

import (
	"context"

	"kiln/machined/internal/resource"
)

// The API controller keeps the running API's certificate and client CAs what config/machine's
// api section says, and owns api/status: where the API listens, what it presents, and which
// config version that is. The boot starts the API (it serves the machine's state, which the boot
// has finished setting by then); from the ready line on, this controller follows each config:
// a new certificate, or a new client CA bundle, is in place for the next handshake without a
// restart, as connections already open keep theirs. Turning the API on or off waits for the next
// boot (config_apply.go says so to whoever applies it).
const (
	apiStatusType resource.Type = "api/status"
	apiStatusID                 = "api"
)

// apiStatusSpec is api/status.
type apiStatusSpec struct {
	Address       string `json:"address,omitempty"`     // where it listens ("" when off)
	Certificate   string `json:"certificate,omitempty"` // the certificate it presents
	ClientCAs     string `json:"client_cas,omitempty"`  // the CAs clients' certificates must chain to
	ConfigVersion uint64 `json:"config_version"`        // the config/machine version it serves
	Problem       string `json:"problem,omitempty"`     // why the config's certificate or CAs are not in place
}

// runningAPI is the API the boot started: its address, TLS side, and the api section it started
// with; nil TLS when it is off.
type runningAPI struct {
	addr    string
	tls     *apiTLS
	started APIConfig
}

// apiController follows config/machine's api section once the machine is ready.
type apiController struct {
	running func() runningAPI
	say     func(string, ...interface{})
	serving *APIConfig // what it put in place last; only this controller's goroutine touches it
}

func (c *apiController) Name() string { return "api" }
func (c *apiController) Inputs() []resource.Type {
	return []resource.Type{machineConfigType, readyType}
}
func (c *apiController) Outputs() []resource.Type { return []resource.Type{apiStatusType} }

func (c *apiController) Reconcile(_ context.Context, r *resource.Run) error {
	if _, ready := r.Get(readyType, readyID); !ready {
		return nil // the boot is still starting the API
	}
	res, ok := r.Get(machineConfigType, machineConfigID)
	spec, isSpec := resource.SpecOf[machineConfigSpec](res)
	if !ok || !isSpec || spec.Config == nil {
		return nil
	}
	api := c.running()
	status := apiStatusSpec{ConfigVersion: res.Version}
	if api.tls == nil {
		return r.Put(apiStatusType, apiStatusID, status) // off until the next boot
	}
	if c.serving == nil {
		c.serving = &api.started
	}
	if want := spec.Config.API; want.Enabled() {
		status.Problem = c.follow(api.tls, want)
	}
	caPEM, _ := c.serving.clientCA()
	status.Address, status.Certificate, status.ClientCAs = api.addr, certName(api.tls), caNames(caPEM)
	return r.Put(apiStatusType, apiStatusID, status)
}

// follow puts want's certificate and client CAs in place where they differ from what is served,
// and says why one could not be ("" when all is in place).
func (c *apiController) follow(t *apiTLS, want APIConfig) string {
	problem := ""
	if want.Cert != c.serving.Cert || want.Key != c.serving.Key {
		if err := t.setCert(want.Cert, want.Key); err != nil {
			c.say("api: the new certificate was not put in place: %v", err)
			problem = "certificate: " + err.Error()
		} else {
			c.serving.Cert, c.serving.Key = want.Cert, want.Key
			c.say("api: serving certificate %s from now on", certName(t))
		}
	}
	oldCA, _ := c.serving.clientCA()
	newCA, err := want.clientCA()
	if err != nil || oldCA == newCA {
		return problem
	}
	if err := t.setClientCAs(newCA); err != nil {
		c.say("api: the new client CA was not put in place: %v", err)
		return "client CA: " + err.Error()
	}
	c.serving.ClientCA, c.serving.CA = want.ClientCA, want.CA
	c.say("api: clients' certificates must chain to %s from now on", caNames(newCA))
	return problem
}
