package main

import (
	"context"
	"crypto/ed25519"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A tarball URL on a server that ignores Range would have to be downloaded whole before its
// signature could be checked: refused, saying why, unless unsigned upgrades are allowed.
func TestATarballURLWithoutByteRangesIsRefusedWhenSignaturesAreRequired(t *testing.T) {
	var sent int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent++
		w.Write([]byte(strings.Repeat("x", 1<<20))) // 200, whatever the Range
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	key := releaseKeyPEM(t, seededKey(1).Public().(ed25519.PublicKey))
	m := &machine{con: quietConsole(), cfg: &Config{ReleaseKeys: []string{key}, Registries: []RegistryConfig{{Host: host, Insecure: true}}}}
	_, _, err := m.upgradeSource(context.Background(), upgradeRequest{URL: srv.URL + "/installer.tar"})
	if err == nil || !strings.Contains(err.Error(), "does not serve byte ranges") || !strings.Contains(err.Error(), "Range requests") {
		t.Fatalf("%v", err)
	}
	if sent != 1 {
		t.Fatalf("%d requests", sent)
	}
}
