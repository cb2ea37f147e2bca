package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// idleConns opens n TCP connections to addr from the loopback address from (127.0.0.0/8 is all
// loopback on Linux, so each from is another source) and sends nothing on them: the cheapest way
// to hold a server's descriptors. Refused ones are counted by the caller's reads.
func idleConns(t testing.TB, addr, from string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	conns := make([]net.Conn, 0, n)
	for i := 0; i < n; i++ {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("idle connection %d from %s: %v", i, from, err)
		}
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

// closedByServer says whether the server closed c within wait (a read ends without a timeout).
func closedByServer(c net.Conn, wait time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	_, err := c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return err != nil
}

func hostPort(url string) string { return strings.TrimPrefix(url, "https://") }

// timedStatus is one authenticated GET /v1/status on a new connection, and how long it took.
func timedStatus(t testing.TB, a *authAPI, c *http.Client) time.Duration {
	t.Helper()
	start := time.Now()
	resp, err := c.Get(a.url + "/v1/status")
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status: %s", resp.Status)
	}
	return time.Since(start)
}

// freshClient opens a new connection per request, as kiln node does.
func freshClient(t testing.TB, a *authAPI, role string) *http.Client {
	c := a.client(t, role)
	c.Transport.(*http.Transport).DisableKeepAlives = true
	return c
}

// 2,000 idle TCP connections, from 20 source addresses, against the real default limits (256 in
// all, 32 per source): an authenticated status still answers at once, because a new connection
// evicts the one that has waited longest without a request.
func TestAPIStatusAnswersPast2000IdleConnections(t *testing.T) {
	a := startAuthAPI(t, defaultAPILimits)
	addr := hostPort(a.url)
	for i := 1; i <= 20; i++ {
		idleConns(t, addr, fmt.Sprintf("127.0.1.%d", i), 100)
	}
	c := freshClient(t, a, "reader")
	for i := 0; i < 5; i++ {
		if took := timedStatus(t, a, c); took > 2*time.Second {
			t.Fatalf("status took %s past 2,000 idle connections", took)
		}
	}
	if !strings.Contains(a.log.String(), "it has 32 open") {
		t.Errorf("the refusals are not logged: %s", a.log.String())
	}
}

func TestAPIRefusesPastThePerSourceCap(t *testing.T) {
	limits := defaultAPILimits
	limits.MaxConnsPerSource = 4
	a := startAuthAPI(t, limits)
	conns := idleConns(t, hostPort(a.url), "127.0.0.2", 6)
	for i, c := range conns {
		if closed := closedByServer(c, 300*time.Millisecond); closed != (i >= 4) {
			t.Errorf("connection %d from one source: closed %v", i, closed)
		}
	}
	timedStatus(t, a, freshClient(t, a, "reader")) // another source is not held back
}

func TestAPIGlobalCapEvictsTheOldestWaitingThenRefuses(t *testing.T) {
	limits := defaultAPILimits
	limits.MaxConns, limits.MaxConnsPerSource = 4, 100
	a := startAuthAPI(t, limits)
	addr := hostPort(a.url)
	first := idleConns(t, addr, "127.0.0.3", 4)
	time.Sleep(50 * time.Millisecond)
	idleConns(t, addr, "127.0.0.4", 1)
	if !closedByServer(first[0], time.Second) {
		t.Fatal("the oldest waiting connection was not closed to make room")
	}
	if closedByServer(first[3], 200*time.Millisecond) {
		t.Fatal("a newer waiting connection was closed")
	}
	// four connections that each started a request hold the API; a fifth is refused
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(a.serverCA.pem))
	me := a.clientCA.issueSpec(t, certSpec{name: "op", orgs: []string{"operator"}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	pair, _ := tls.X509KeyPair([]byte(me.certPEM), []byte(me.keyPEM))
	var held []*tls.Conn
	for i := 0; i < 4; i++ {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}})
		if err != nil {
			t.Fatalf("authenticated connection %d: %v", i, err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "GET /v1/status HTTP/1.1\r\nHost: m\r\n\r\n")
		if _, err := c.Read(make([]byte, 1)); err != nil { // the answer has begun: the request started
			t.Fatalf("authenticated connection %d: %v", i, err)
		}
		held = append(held, c)
	}
	late := idleConns(t, addr, "127.0.0.5", 1)
	if !closedByServer(late[0], time.Second) {
		t.Fatal("a connection past the cap was not refused while every slot held a started request")
	}
}

func TestAPIClosesConnectionsThatSendNothing(t *testing.T) {
	limits := defaultAPILimits
	limits.HandshakeTimeout = 200 * time.Millisecond
	a := startAuthAPI(t, limits)
	c := idleConns(t, hostPort(a.url), "127.0.0.6", 1)[0]
	start := time.Now()
	if !closedByServer(c, 3*time.Second) {
		t.Fatal("a connection that never began its handshake is still open after 3 s")
	}
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Fatalf("closed after %s, before the handshake timeout", took)
	}
}

// dialAs opens a TLS connection to a's API as name with role, closed when the test ends.
func dialAs(t *testing.T, a *authAPI, name, role string) *tls.Conn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(a.serverCA.pem))
	me := a.clientCA.issueSpec(t, certSpec{name: name, orgs: []string{role}, usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	pair, _ := tls.X509KeyPair([]byte(me.certPEM), []byte(me.keyPEM))
	c, err := tls.Dial("tcp", hostPort(a.url), &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestAPIClosesIdleKeptAliveConnections(t *testing.T) {
	limits := defaultAPILimits
	limits.IdleTimeout = 200 * time.Millisecond
	a := startAuthAPI(t, limits)
	c := dialAs(t, a, "r", "reader")
	_, _ = io.WriteString(c, "GET /v1/status HTTP/1.1\r\nHost: m\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for !strings.Contains(got.String(), "\"version\"") {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("status: %v (%q)", err, got.String())
		}
		got.Write(buf[:n])
	}
	if _, err := c.Read(buf); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a kept-alive connection idle past IdleTimeout was not closed: %v", err)
	}
}

func TestAPILogsHandshakeFailuresAtAMeasuredRate(t *testing.T) {
	a := startAuthAPI(t, defaultAPILimits)
	for i := 0; i < 40; i++ {
		c, err := tls.Dial("tcp", hostPort(a.url), &tls.Config{InsecureSkipVerify: true}) // no client certificate
		if err == nil {
			_, _ = c.Read(make([]byte, 1)) // TLS 1.3: the refusal arrives after the handshake
			c.Close()
		}
	}
	time.Sleep(200 * time.Millisecond)
	if n := strings.Count(a.log.String(), "TLS handshake error"); n == 0 || n > apiLogBurst {
		t.Fatalf("%d handshake errors logged of 40, want 1 to %d:\n%s", n, apiLogBurst, a.log.String())
	}
}

func TestRateLimitedLogSaysWhatItDropped(t *testing.T) {
	var out bytes.Buffer
	now := time.Unix(1000, 0)
	l := newRateLimitedLog(&out, 3, time.Minute)
	l.now = func() time.Time { return now }
	for i := 0; i < 10; i++ {
		fmt.Fprintf(l, "line %d\n", i)
	}
	now = now.Add(time.Minute)
	fmt.Fprintf(l, "line 10\n")
	want := "line 0\nline 1\nline 2\napi: 7 more connection errors were not logged (at most 3 every 1m0s)\nline 10\n"
	if out.String() != want {
		t.Fatalf("log:\n%s\nwant:\n%s", out.String(), want)
	}
}

// A request whose body never finishes ends at ReadTimeout instead of holding its handler.
func TestAPIReadTimeoutEndsASlowRequest(t *testing.T) {
	limits := defaultAPILimits
	limits.ReadTimeout = 300 * time.Millisecond
	a := startAuthAPI(t, limits)
	c := dialAs(t, a, "op", "operator")
	start := time.Now()
	_, _ = io.WriteString(c, "POST /v1/upgrade HTTP/1.1\r\nHost: m\r\nContent-Length: 1000\r\n\r\n{\"image\": ")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	answer, _ := io.ReadAll(c)
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("a request stuck in its body held the connection %s", took)
	}
	if !strings.Contains(string(answer), "400 Bad Request") || !strings.Contains(string(answer), "timeout") {
		t.Fatalf("answer to a request stuck in its body: %q", answer)
	}
	a.backend.mu.Lock()
	defer a.backend.mu.Unlock()
	if len(a.backend.upgrades) != 0 {
		t.Fatalf("a request cut short reached the machine: %+v", a.backend.upgrades)
	}
}

func TestAPISourcesAreAddressesAndIPv6Networks(t *testing.T) {
	for addr, want := range map[net.Addr]string{
		&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 1}:             "192.0.2.7",
		&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 1}:      "192.0.2.7",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 1}:  "2001:db8:1:2::/64",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:bbbb::99"), Port: 1}: "2001:db8:1:2::/64",
		&net.UnixAddr{Name: "@x", Net: "unix"}:                          "@x",
	} {
		if got := sourceOf(addr); got != want {
			t.Errorf("%v: source %q, want %q", addr, got, want)
		}
	}
}
