package main

import (
	"context"

	"kiln/machined/internal/resource"
)

// The API controller runs the API and owns api/status: where the API listens, what it
// presents, and which config version that is. It starts the API when the boot starts the
// services (machine/stage: by then the boot has set the facts the API serves) from the config's
// api section, and stops it when the machine stops. It follows each config from then on: a new
// certificate, or a new client CA bundle, is in place for the next handshake without a restart,
// as connections already open keep theirs. Turning the API on or off waits for the next boot
// (config_apply.go says so to whoever applies it).
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

// runningAPI is the API the controller started: its address, TLS side, and the api section it
// started with; nil TLS when it is off.
type runningAPI struct {
	addr    string
	tls     *apiTLS
	started APIConfig
}

// apiController runs the API (see above).
type apiController struct {
	serve   func(APIConfig) (*apiServer, error) // starts an API (serveAPI, with the machine as its backend)
	publish func(runningAPI)                    // tells the machine what runs (machine.runningAPI)
	say     func(string, ...interface{})
	// only this controller's goroutine touches these
	tried   bool       // it started the API, or found it off, once this boot
	server  *apiServer // the running API, nil when off or stopped
	off     string     // why the config's API is not running ("" when it is, or the config has none)
	serving *APIConfig // what it put in place last
}

func (c *apiController) Name() string { return "api" }
func (c *apiController) Inputs() []resource.Type {
	return []resource.Type{machineConfigType, stageType}
}
func (c *apiController) Outputs() []resource.Type { return []resource.Type{apiStatusType} }

func (c *apiController) Reconcile(_ context.Context, r *resource.Run) error {
	stage := stageIn(r)
	if stage == stageStopping && c.server != nil {
		c.server.stop()
		c.server = nil
		c.publish(runningAPI{})
	}
	if !serving(stage) && c.server == nil && !c.tried {
		return nil // the boot has not started the services yet
	}
	res, ok := r.Get(machineConfigType, machineConfigID)
	spec, isSpec := resource.SpecOf[machineConfigSpec](res)
	if !ok || !isSpec || spec.Config == nil {
		return nil
	}
	if !c.tried && serving(stage) {
		c.tried = true
		c.start(spec.Config.API)
	}
	status := apiStatusSpec{ConfigVersion: res.Version, Problem: c.off}
	if c.server == nil {
		return r.Put(apiStatusType, apiStatusID, status) // off until the next boot
	}
	if want := spec.Config.API; want.Enabled() {
		status.Problem = c.follow(c.server.tls, want)
	}
	caPEM, _ := c.serving.clientCA()
	status.Address, status.Certificate, status.ClientCAs = c.server.addr.String(), certName(c.server.tls), caNames(caPEM)
	return r.Put(apiStatusType, apiStatusID, status)
}

// start starts the API of the config's api section, if it has one.
func (c *apiController) start(api APIConfig) {
	if !api.Enabled() {
		return
	}
	server, err := c.serve(api)
	if err != nil {
		c.say("api: %v; the API is off", err)
		c.off = "the API is off: " + err.Error()
		return
	}
	c.server, c.serving = server, &api
	c.publish(runningAPI{addr: server.addr.String(), tls: server.tls, started: api})
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
