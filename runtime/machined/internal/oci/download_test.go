package oci

import (
	"context"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The servers here are real HTTP servers from net/http/httptest standing in for wherever a
// layout tarball is published.
func TestDownload(t *testing.T) {
	body := strings.Repeat("layout", 1000)
	mux := http.NewServeMux()
	mux.HandleFunc("/installer.tar", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(body)) })
	mux.HandleFunc("/chunked.tar", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		w.Write([]byte(body))
	})
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/installer.tar", http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	dest := filepath.Join(t.TempDir(), "installer.tar")

	n, err := Download(context.Background(), srv.URL+"/moved", dest, 1<<20, true, nil)
	if err != nil || n != int64(len(body)) || readFile(t, dest) != body {
		t.Fatalf("n=%d err=%v", n, err)
	}

	_, err = Download(context.Background(), srv.URL+"/installer.tar", dest, 1<<20, false, nil)
	wantErr(t, err, "refusing plain http URL")

	for _, p := range []string{"/installer.tar", "/chunked.tar"} {
		_, err = Download(context.Background(), srv.URL+p, dest, 100, true, nil)
		wantErr(t, err, "100")
		if _, serr := os.Stat(dest); serr == nil {
			t.Fatalf("%s: a partial download was left behind", p)
		}
	}

	_, err = Download(context.Background(), srv.URL+"/missing?token=secret", dest, 1<<20, true, nil)
	wantErr(t, err, "404 Not Found")
	if strings.Contains(err.Error(), "secret") {
		t.Fatalf("error shows the query: %v", err)
	}

	for _, u := range []string{"ftp://example.com/x", "file:///etc/passwd", "http:///x", "::"} {
		_, err = Download(context.Background(), u, dest, 1<<20, true, nil)
		if err == nil {
			t.Errorf("%s: downloaded", u)
		}
	}
	_, err = Download(context.Background(), srv.URL+"/installer.tar", dest, 0, true, nil)
	wantErr(t, err, "max must be positive")
}

func TestDownloadTLS(t *testing.T) {
	srv := quietTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/down" {
			http.Redirect(w, r, "http://"+r.Host+"/x", http.StatusFound)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	dest := filepath.Join(t.TempDir(), "x")

	if n, err := Download(context.Background(), srv.URL+"/x", dest, 10, false, pool); err != nil || n != 2 {
		t.Fatalf("n=%d err=%v", n, err)
	}
	_, err := Download(context.Background(), srv.URL+"/x", dest, 10, false, nil)
	wantErr(t, err, "certificate")
	// https may not redirect to plain http unless insecure.
	_, err = Download(context.Background(), srv.URL+"/down", dest, 10, false, pool)
	wantErr(t, err, "refusing plain http URL")
}
