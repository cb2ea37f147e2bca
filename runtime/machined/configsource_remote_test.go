package main

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const remoteBody = "hostname: from-remote\n"

func remoteServer(t *testing.T, tls bool, body string) *httptest.Server {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(body)) })
	var s *httptest.Server
	if tls {
		s = httptest.NewTLSServer(h)
	} else {
		s = httptest.NewServer(h)
	}
	t.Cleanup(s.Close)
	return s
}

func digestOf(s string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(s))) }

func TestRemoteConfigRefusesPlainHTTPWithoutDigest(t *testing.T) {
	for _, value := range []string{"http://10.0.0.1/kiln.yaml", "http://10.0.0.1/kiln.yaml#md5=00",
		"http://10.0.0.1/x#sha256=abc", "https:///nohost"} {
		if _, err := parseRemoteConfig(value); err == nil {
			t.Errorf("%q accepted", value)
		}
	}
	if _, err := parseRemoteConfig("https://10.0.0.1/kiln.yaml"); err != nil {
		t.Errorf("https refused: %v", err)
	}
}

func TestRemoteConfigOverHTTPWithMatchingDigest(t *testing.T) {
	s := remoteServer(t, false, remoteBody)
	remote, err := parseRemoteConfig(s.URL + "/kiln.yaml#sha256=" + digestOf(remoteBody))
	if err != nil {
		t.Fatal(err)
	}
	data, err := fetch(configClient(remote), remote)
	if err != nil || string(data) != remoteBody {
		t.Fatalf("got %q, %v", data, err)
	}
}

func TestRemoteConfigDigestMismatchIsRefused(t *testing.T) {
	s := remoteServer(t, false, "hostname: tampered\n")
	remote, err := parseRemoteConfig(s.URL + "/kiln.yaml#sha256=" + digestOf(remoteBody))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fetch(configClient(remote), remote); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatch not refused: %v", err)
	}
}

func TestRemoteConfigOversizeIsRefused(t *testing.T) {
	s := remoteServer(t, true, strings.Repeat("#", maxRemoteConfig+10))
	remote, _ := parseRemoteConfig(s.URL + "/kiln.yaml")
	client := configClient(remote)
	client.Transport = s.Client().Transport // the test server's own CA stands in for the rootfs bundle
	if _, err := fetch(client, remote); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversize body not refused: %v", err)
	}
}

func TestRemoteConfigHTTPSVerifiesTheCertificate(t *testing.T) {
	s := remoteServer(t, true, remoteBody)
	remote, _ := parseRemoteConfig(s.URL + "/kiln.yaml")
	if _, err := fetch(configClient(remote), remote); err == nil {
		t.Fatal("a certificate no CA in the bundle signed was accepted")
	}
	client := configClient(remote)
	client.Transport = s.Client().Transport
	if data, err := fetch(client, remote); err != nil || string(data) != remoteBody {
		t.Fatalf("got %q, %v", data, err)
	}
}

func TestRemoteConfigRedirectToHTTPIsRefused(t *testing.T) {
	plain := remoteServer(t, false, remoteBody)
	s := httptest.NewTLSServer(http.RedirectHandler(plain.URL+"/kiln.yaml", http.StatusFound))
	t.Cleanup(s.Close)
	remote, _ := parseRemoteConfig(s.URL + "/kiln.yaml")
	client := configClient(remote)
	client.Transport = s.Client().Transport
	if _, err := fetch(client, remote); err == nil || !strings.Contains(err.Error(), "not https") {
		t.Fatalf("downgrade not refused: %v", err)
	}
}
