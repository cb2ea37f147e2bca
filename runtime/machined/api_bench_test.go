package main

import (
	"crypto/x509"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sort"
	"testing"
	"time"

	"kiln/machined/internal/testkit"
)

// TestAPIStatusLatency measures GET /v1/status with idle TCP connections held open, on the API
// as it was (mutual TLS, a header timeout, nothing else) and as it is (apiLimits), and writes
// the figures to $KILN_API_BENCH (bench/api.py runs it); without the variable it is skipped.
func TestAPIStatusLatency(t *testing.T) {
	out := benchOutput(t, "KILN_API_BENCH", "bench/api.py")
	const requests = 500
	results := map[string]interface{}{"requests_per_case": requests}
	for _, server := range []string{"before", "after"} {
		for _, idle := range []struct {
			conns, sources int
		}{{0, 1}, {200, 10}, {2000, 20}} {
			name := fmt.Sprintf("%s_idle%d", server, idle.conns)
			// a subtest each: its server and connections are gone before the next one counts descriptors
			t.Run(name, func(t *testing.T) {
				a := startBenchAPI(t, server == "after")
				before := openFiles(t)
				for i := 0; i < idle.sources && idle.conns > 0; i++ {
					idleConns(t, hostPort(a.url), fmt.Sprintf("127.0.%d.%d", 3+idle.conns/1000, i+1), idle.conns/idle.sources)
				}
				time.Sleep(200 * time.Millisecond) // every idle connection accepted (or refused) first
				// the server's side of the idle connections: what PID 1 would hold
				held := openFiles(t) - before - idle.conns
				fresh, kept := freshClient(t, a, "reader"), a.client(t, "reader")
				defer kept.CloseIdleConnections()
				results[name] = map[string]interface{}{
					"new_connection_ms":  latencies(t, a, fresh, requests),
					"kept_alive_ms":      latencies(t, a, kept, requests),
					"server_descriptors": held,
				}
				t.Logf("%s: %v", name, results[name])
			})
		}
	}
	writeBenchResults(t, out, results)
}

// startBenchAPI serves the API with the limits (after) or as serveAPI did before them.
func startBenchAPI(t *testing.T, limited bool) *authAPI {
	if limited {
		return startAuthAPI(t, defaultAPILimits)
	}
	a := &authAPI{serverCA: newTestCA(t, "machines CA"), clientCA: newTestCA(t, "clients CA"), log: &testkit.SyncBuffer{}, backend: &fakeBackend{}}
	a.machine = a.serverCA.issueSpec(t, certSpec{name: "machine", server: true})
	tlsSetup, err := APIConfig{ClientCA: a.clientCA.pem, Cert: a.machine.certPEM, Key: a.machine.keyPEM}.tlsConfig()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           apiHandler(a.backend, tlsSetup.serverKey, nil),
		TLSConfig:         tlsSetup.config,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(a.log, "api: ", 0),
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	a.url = "https://" + ln.Addr().String()
	return a
}

// latencies runs n sequential status requests and summarises their times in milliseconds.
func latencies(t *testing.T, a *authAPI, c *http.Client, n int) map[string]float64 {
	times := make([]float64, n)
	for i := range times {
		times[i] = float64(timedStatus(t, a, c).Microseconds()) / 1000
	}
	sort.Float64s(times)
	at := func(q float64) float64 { return round2(times[int(q*float64(n-1))]) }
	sum := 0.0
	for _, v := range times {
		sum += v
	}
	return map[string]float64{"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1), "mean": round2(sum / float64(n))}
}

func round2(v float64) float64 { return float64(int(v*100+0.5)) / 100 }

// openFiles counts this process's descriptors (client and server sides both live here).
func openFiles(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// BenchmarkConnTrackerAdmitRelease is what the limits add to each connection: counting it in,
// its handshake timer, counting it out.
func BenchmarkConnTrackerAdmitRelease(b *testing.B) {
	tracker := newConnTracker(defaultAPILimits, func(string, ...interface{}) {})
	for i := 0; i < b.N; i++ {
		server, client := net.Pipe()
		c := tracker.admit(server)
		tracker.started(c)
		_ = c.Close()
		_ = client.Close()
	}
}

// BenchmarkClientIdentity is what the role check adds to each request.
func BenchmarkClientIdentity(b *testing.B) {
	ca := newTestCA(b, "bench CA")
	leaf := ca.issueSpec(b, certSpec{name: "r", orgs: []string{"reader"}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}).cert
	for i := 0; i < b.N; i++ {
		if _, err := clientIdentity(leaf, ca.cert.RawSubjectPublicKeyInfo); err != nil {
			b.Fatal(err)
		}
	}
}
