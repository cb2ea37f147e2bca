package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
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
}

// apiHandler routes the v1 API. Every route sits behind mutual TLS (see serveAPI), so
// the handler itself does no authentication.
func apiHandler(b apiBackend) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/status", method(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, b.Status())
	}))
	mux.HandleFunc("/v1/services", method(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]interface{}{"services": b.Services()})
	}))
	mux.HandleFunc("/v1/logs", method(http.MethodGet, func(w http.ResponseWriter, r *http.Request) {
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
		mux.HandleFunc("/v1/"+action, method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusAccepted, map[string]string{"action": action})
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			// after the reply is on its way: shutting down takes the network with it
			safego.Go("api "+action, func() { time.Sleep(200 * time.Millisecond); b.Power(action) })
		}))
	}
	mux.HandleFunc("/v1/rollback", method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
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
	mux.HandleFunc("/v1/upgrade", method(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
		req, err := upgradeJSON(r.Body)
		var status *upgradeStatus
		if err == nil {
			status, err = b.Upgrade(req)
		}
		if err != nil {
			code := http.StatusBadRequest
			var ae *apiError
			if errors.As(err, &ae) {
				code = ae.code
			}
			writeJSON(w, code, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]interface{}{"upgrade": status})
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such endpoint: " + r.URL.Path})
	})
	return mux
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

// serveAPI listens with mutual TLS: a client without a certificate signed by the
// configured CA fails the handshake and never reaches a handler. errorLog receives
// connection errors (refused handshakes included).
func serveAPI(cfg APIConfig, b apiBackend, errorLog io.Writer) (net.Addr, func(), error) {
	tlsConfig, err := cfg.tlsConfig()
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", cfg.listen())
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{
		Handler:           apiHandler(b),
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(errorLog, "api: ", 0),
	}
	safego.Go("api server", func() { _ = srv.Serve(tls.NewListener(ln, tlsConfig)) })
	return ln.Addr(), func() { _ = srv.Close() }, nil
}
