package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"kiln/machined/internal/safego"
	"kiln/machined/internal/supervisor"
)

// apiBackend is what the API serves; the machine implements it, tests fake it.
type apiBackend interface {
	Status() interface{}
	Services() []supervisor.ServiceStatus
	Logs(service string) ([]string, bool)
	Power(action string)                                // "reboot" or "poweroff"; called after the response is sent
	Rollback() (string, error)                          // make the other A/B slot the default; the handler then reboots
	Upgrade(req upgradeRequest) (*upgradeStatus, error) // start one; an *apiError says how to refuse
	Resources(t string) []apiResource                   // the machine's resources of type t ("" for all), sorted
	// WatchResources follows resources of type t ("" for all), of one id ("" for all); an
	// *apiError says how to refuse (api_resources.go).
	WatchResources(t, id string) (resourceWatch, error)
	// ApplyConfig checks, keeps and applies a config, calling answer with the report before
	// anything is applied; an *apiError says how to refuse (config_apply.go).
	ApplyConfig(req configRequest, answer func(*configReport)) error
}

// apiRoutes are the v1 API's endpoints and the least role each needs (api_auth.go).
var apiRoutes = map[string]role{
	"/v1/status":    roleReader,
	"/v1/services":  roleReader,
	"/v1/logs":      roleReader,
	"/v1/resources": roleReader,
	"/v1/reboot":    roleOperator,
	"/v1/rollback":  roleOperator,
	"/v1/upgrade":   roleOperator, // preserve: false (wiping /var) needs admin
	"/v1/poweroff":  roleAdmin,    // nobody may be there to power the machine on again
	"/v1/config":    roleAdmin,    // the config holds root services and the API's own trust
}

// apiHandler routes the v1 API. Every route sits behind mutual TLS (see serveAPI) and
// authorize; each route then checks its role (apiRoutes). refused hears every refusal.
func apiHandler(b apiBackend, serverKey func() []byte, refused func(string)) http.Handler {
	mux := http.NewServeMux()
	handle := func(path string, h http.HandlerFunc) {
		need, ok := apiRoutes[path]
		if !ok {
			need = roleAdmin // a route nobody gave a role is admin's
		}
		mux.HandleFunc(path, requireRole(need, refused, h))
	}
	handle("/v1/status", method(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, b.Status())
	}))
	handle("/v1/resources", method(http.MethodGet, resourcesHandler(b, newWatchLimiter())))
	handle("/v1/config", method(http.MethodPost, applyConfigHandler(b)))
	handle("/v1/services", method(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]interface{}{"services": b.Services()})
	}))
	handle("/v1/logs", method(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("service")
		if name == "" {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "service= is required (\"machined\" for machined's own log)"})
			return
		}
		lines, ok := b.Logs(name)
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such service: " + name})
			return
		}
		if r.URL.Query().Get("format") == "text" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, strings.Join(lines, "\n")+"\n")
			return
		}
		writeJSON(w, http.StatusOK, map[string]interface{}{"service": name, "lines": lines})
	}))
	for _, action := range []string{"reboot", "poweroff"} {
		action := action
		handle("/v1/"+action, method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusAccepted, map[string]string{"action": action})
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			// after the reply is on its way: shutting down takes the network with it
			safego.Go("api "+action, func() { time.Sleep(200 * time.Millisecond); b.Power(action) })
		}))
	}
	handle("/v1/rollback", method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
		slot, err := b.Rollback()
		if err != nil {
			writeJSON(w, http.StatusConflict, map[string]string{"error": "rollback: " + err.Error()})
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"action": "rollback", "slot": slot})
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		safego.Go("api rollback", func() { time.Sleep(200 * time.Millisecond); b.Power(actionReboot) })
	}))
	handle("/v1/upgrade", method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
		req, err := upgradeJSON(r.Body)
		if err == nil && !req.preserve() && requestIdentity(r).role < roleAdmin {
			forbid(w, r, refused, requestIdentity(r).name, fmt.Sprintf("role %s may not upgrade with preserve: false (it wipes /var): it needs admin", requestIdentity(r).role))
			return
		}
		var status *upgradeStatus
		if err == nil {
			status, err = b.Upgrade(req)
		}
		if err != nil {
			writeError(w, err, http.StatusBadRequest)
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]interface{}{"upgrade": status})
	}))
	mux.HandleFunc("/", requireRole(roleReader, refused, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such endpoint: " + r.URL.Path})
	}))
	return authorize(serverKey, refused, mux)
}

func method(m string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != m {
			w.Header().Set("Allow", m)
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": r.URL.Path + " takes " + m})
			return
		}
		h(w, r)
	}
}

func writeJSON(w http.ResponseWriter, code int, v interface{}) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// writeError answers {"error": ...} with the status an apiError carries, else with code.
func writeError(w http.ResponseWriter, err error, code int) {
	var ae *apiError
	if errors.As(err, &ae) {
		code = ae.code
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

// serveAPI listens with mutual TLS: a client without a certificate signed by the client CA
// fails the handshake and never reaches a handler; authorize and the routes check the rest.
// Connections are bounded in number (in total and per source) and in time (apiLimits).
// errorLog receives connection errors and refusals, at most apiLogBurst every apiLogWindow.
func serveAPI(cfg APIConfig, b apiBackend, errorLog io.Writer) (*apiServer, error) {
	return serveAPIWith(cfg, defaultAPILimits, b, errorLog)
}

// apiServer is a running API: where it listens, how to stop it, and its TLS side (setCert).
type apiServer struct {
	addr net.Addr
	stop func()
	tls  *apiTLS
}

const (
	apiLogBurst  = 10
	apiLogWindow = time.Minute
)

func serveAPIWith(cfg APIConfig, limits apiLimits, b apiBackend, errorLog io.Writer) (*apiServer, error) {
	t, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.listen())
	if err != nil {
		return nil, err
	}
	if t.sharedCA() {
		_, _ = io.WriteString(errorLog, "api: the client CA also signs this machine's certificate: machines' certificates are refused "+
			"as clients, but keep two CAs (kiln secrets generate makes them)\n")
	}
	logger := log.New(newRateLimitedLog(errorLog, apiLogBurst, apiLogWindow), "api: ", 0)
	tracker := newConnTracker(limits, logger.Printf)
	srv := &http.Server{
		Handler:           apiHandler(b, t.serverKey, func(line string) { logger.Print(line) }),
		TLSConfig:         t.config,
		ReadHeaderTimeout: limits.ReadHeaderTimeout,
		ReadTimeout:       limits.ReadTimeout,
		WriteTimeout:      limits.WriteTimeout,
		IdleTimeout:       limits.IdleTimeout,
		MaxHeaderBytes:    limits.MaxHeaderBytes,
		ConnState:         tracker.connState,
		ErrorLog:          logger,
		// HTTP/1.1 only: the limits count requests per connection, and kiln node speaks 1.1
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	limited := limitedListener{Listener: ln, tracker: tracker}
	safego.Go("api server", func() { _ = srv.Serve(tls.NewListener(limited, t.config)) })
	return &apiServer{addr: ln.Addr(), stop: func() { _ = srv.Close() }, tls: t}, nil
}
