package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A kiln.config= URL's credentials and query never reach an error (and so the console).
func TestConfigURLErrorsAreRedacted(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	digest := "#sha256=" + strings.Repeat("0", 64)
	remote, err := parseRemoteConfig(strings.Replace(srv.URL, "://", "://admin:hunter2@", 1) + "/k.yaml?X-Amz-Signature=s3cr3t" + digest)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fetch(configClient(remote), remote)
	if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "404") {
		t.Fatalf("404: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	remote, _ = parseRemoteConfig("http://admin:hunter2@" + closed + "/k.yaml?sig=s3cr3t" + digest)
	_, err = fetch(configClient(remote), remote)
	if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("connection refused: %v", err)
	}
	if _, err := parseRemoteConfig("http://admin:hunter2@h/k.yaml?sig=s3cr3t"); err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("plain http: %v", err)
	}
	if _, err := parseRemoteConfig("https://admin:hunter2@:bad/k?sig=s3cr3t"); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("not a URL: %v", err)
	}
}

// An upgrade from a presigned or credentialed URL shows neither in the status, the console
// (both take describe()) or the refusal of a bad one.
func TestUpgradeURLsAreRedacted(t *testing.T) {
	req := upgradeRequest{URL: "https://ci:hunter2@bucket.example/installer.tar?X-Amz-Signature=s3cr3t", Digest: "sha256:" + strings.Repeat("a", 64)}
	if got := req.describe(); got != "https://REDACTED@bucket.example/installer.tar?REDACTED" {
		t.Fatalf("describe: %q", got)
	}
	bad := upgradeRequest{URL: "ftp://ci:hunter2@bucket.example/i.tar?sig=s3cr3t"}
	if err := bad.check(); err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("check: %v", err)
	}
}

func TestConfigSourceName(t *testing.T) {
	for in, want := range map[string]string{
		"/etc/kiln config?.yaml":                       "/etc/kiln config?.yaml",
		"https://u:p@cfg.example/k.yaml?token=abc":     "https://REDACTED@cfg.example/k.yaml?REDACTED",
		"http://10.0.0.1/k.yaml#sha256=" + sha256Zeros: "http://10.0.0.1/k.yaml#sha256=" + sha256Zeros,
	} {
		if got := configSourceName(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

var sha256Zeros = strings.Repeat("0", 64)
