package main

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// maxConfigBody bounds POST /v1/config's body as every other config source is bounded.
const maxConfigBody = maxRemoteConfig

// applyConfigHandler is POST /v1/config[?mode=auto|staged|dry_run]: the body is a machine config
// (YAML or JSON), checked, kept and applied as the mode says (ApplyConfig). 200 with the report;
// 400 for a config the parser refuses, 409 for a mode this machine cannot do, 413 past the bound.
func applyConfigHandler(b apiBackend) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		mode, err := applyMode(r.URL.Query().Get("mode"))
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		doc, code, err := readConfigBody(w, r)
		if err != nil {
			writeJSON(w, code, map[string]string{"error": err.Error()})
			return
		}
		err = b.ApplyConfig(configRequest{Mode: mode, Doc: doc, Who: requestIdentity(r).name, Client: peerChain(r)}, func(report *configReport) {
			writeJSON(w, http.StatusOK, report)
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
		})
		if err != nil {
			writeError(w, err, http.StatusInternalServerError)
		}
	}
}

func applyMode(value string) (string, error) {
	switch value {
	case "":
		return applyAuto, nil
	case applyAuto, applyStaged, applyDryRun:
		return value, nil
	}
	return "", fmt.Errorf("mode %q: want auto, staged or dry_run", value)
}

// readConfigBody reads the body, at most maxConfigBody bytes: a longer one is refused with 413
// (and the connection is closed after the answer, the rest unread).
func readConfigBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	tooLarge := fmt.Errorf("the config is larger than %d bytes, the most a config may have", maxConfigBody)
	if r.ContentLength > maxConfigBody {
		return nil, http.StatusRequestEntityTooLarge, tooLarge
	}
	doc, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxConfigBody))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return nil, http.StatusRequestEntityTooLarge, tooLarge
	}
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("reading the config: %v", err)
	}
	return doc, 0, nil
}

// peerChain is the certificate a request came with, then the intermediates the client sent.
func peerChain(r *http.Request) []*x509.Certificate {
	if r.TLS == nil {
		return nil
	}
	return r.TLS.PeerCertificates
}
