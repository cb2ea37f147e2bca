package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// apiLimits bound what connections to the API may hold. machined is PID 1: every connection is
// one of its file descriptors, and an unauthenticated client may open as many as it likes.
type apiLimits struct {
	// MaxConns connections at once. Beyond it the connection that has waited longest without
	// starting a request (no TLS handshake done yet, or nothing sent after it) is closed to make
	// room; when every one has started a request, the new connection is refused.
	MaxConns int
	// MaxConnsPerSource connections at once from one source (an IPv4 address, an IPv6 /64);
	// beyond it, refused.
	MaxConnsPerSource int
	// HandshakeTimeout: a connection must finish its TLS handshake and send a request's
	// headers within this time, or it is closed.
	HandshakeTimeout  time.Duration
	ReadHeaderTimeout time.Duration // each later request's headers
	ReadTimeout       time.Duration // a whole request; bodies are small (a config's is at most 1 MiB)
	WriteTimeout      time.Duration // a whole answer; a log is sent at once, a watch ends within watchLifetime
	IdleTimeout       time.Duration // a kept-alive connection between requests
	MaxHeaderBytes    int
}

// defaultAPILimits leave room for a fleet's tooling and a human or two, and stay far below the
// descriptors PID 1 has (Go raises its soft limit to the hard one, 4096 for init by default).
var defaultAPILimits = apiLimits{
	MaxConns:          256,
	MaxConnsPerSource: 32,
	HandshakeTimeout:  10 * time.Second,
	ReadHeaderTimeout: 10 * time.Second,
	ReadTimeout:       30 * time.Second,
	WriteTimeout:      60 * time.Second,
	IdleTimeout:       120 * time.Second,
	MaxHeaderBytes:    16 << 10,
}

// connTracker counts the API's connections, in total and per source address, and knows which
// have not started a request yet (those may be evicted to make room).
type connTracker struct {
	limits    apiLimits
	logf      func(format string, args ...interface{})
	mu        sync.Mutex
	total     int
	perSource map[string]int
	waiting   map[*trackedConn]struct{} // accepted, no request started yet
}

func newConnTracker(limits apiLimits, logf func(string, ...interface{})) *connTracker {
	return &connTracker{limits: limits, logf: logf, perSource: map[string]int{}, waiting: map[*trackedConn]struct{}{}}
}

// trackedConn is one accepted TCP connection, counted until it is closed.
type trackedConn struct {
	net.Conn
	tracker  *connTracker
	source   string
	accepted time.Time
	released bool // guarded by tracker.mu: no longer counted
	timer    *time.Timer
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.tracker.release(c)
	return err
}

// admit counts a new connection, or refuses it (closed, nil) when its source has too many or
// the API is full of connections that all started requests.
func (t *connTracker) admit(conn net.Conn) *trackedConn {
	source := sourceOf(conn.RemoteAddr())
	c := &trackedConn{Conn: conn, tracker: t, source: source, accepted: time.Now()}
	t.mu.Lock()
	var evicted *trackedConn
	switch {
	case t.perSource[source] >= t.limits.MaxConnsPerSource:
		t.mu.Unlock()
		t.logf("refused a connection from %s: it has %d open, the most one address may", source, t.limits.MaxConnsPerSource)
		_ = conn.Close()
		return nil
	case t.total >= t.limits.MaxConns:
		if evicted = t.oldestWaiting(); evicted == nil {
			t.mu.Unlock()
			t.logf("refused a connection from %s: %d connections are open, all in use", source, t.limits.MaxConns)
			_ = conn.Close()
			return nil
		}
		t.forget(evicted)
	}
	t.total++
	t.perSource[source]++
	t.waiting[c] = struct{}{}
	c.timer = time.AfterFunc(t.limits.HandshakeTimeout, func() { t.expire(c) })
	t.mu.Unlock()
	if evicted != nil {
		t.logf("closed a connection from %s that sent no request for %s, to make room", evicted.source, time.Since(evicted.accepted).Round(time.Millisecond))
		_ = evicted.Close()
	}
	return c
}

func (t *connTracker) oldestWaiting() *trackedConn {
	var oldest *trackedConn
	for c := range t.waiting {
		if oldest == nil || c.accepted.Before(oldest.accepted) {
			oldest = c
		}
	}
	return oldest
}

// forget stops counting c (the caller holds t.mu); a second call does nothing.
func (t *connTracker) forget(c *trackedConn) {
	if c.released {
		return
	}
	c.released = true
	c.timer.Stop()
	delete(t.waiting, c)
	t.total--
	if t.perSource[c.source]--; t.perSource[c.source] <= 0 {
		delete(t.perSource, c.source)
	}
}

func (t *connTracker) release(c *trackedConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c.timer != nil {
		t.forget(c)
	}
}

// started marks c as a connection whose client finished the handshake and sent a request.
func (t *connTracker) started(c *trackedConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.waiting[c]; ok {
		delete(t.waiting, c)
		c.timer.Stop()
	}
}

// expire closes c if it still has not started a request.
func (t *connTracker) expire(c *trackedConn) {
	t.mu.Lock()
	_, waiting := t.waiting[c]
	t.mu.Unlock()
	if waiting {
		_ = c.Close()
	}
}

// connState is the http.Server hook: a connection becomes active once a request was read, which
// means its TLS handshake, client certificate included, is done.
func (t *connTracker) connState(conn net.Conn, state http.ConnState) {
	if state != http.StateActive {
		return
	}
	if tc, ok := conn.(*tls.Conn); ok {
		if c, ok := tc.NetConn().(*trackedConn); ok {
			t.started(c)
		}
	}
}

// sourceOf is what the per-source cap counts by: an IPv4 address, or an IPv6 /64 (one
// subscriber's network, where any host may pick as many addresses as it likes).
func sourceOf(addr net.Addr) string {
	if tcp, ok := addr.(*net.TCPAddr); ok {
		if tcp.IP.To4() != nil {
			return tcp.IP.To4().String()
		}
		return tcp.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}

// limitedListener hands out only the connections its tracker admits.
type limitedListener struct {
	net.Listener
	tracker *connTracker
}

func (l limitedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c := l.tracker.admit(conn); c != nil {
			return c, nil
		}
	}
}

// rateLimitedLog passes at most burst writes per window to w and counts the rest, saying how many
// were dropped when the next window opens: a flood of failed handshakes must not flood the log.
type rateLimitedLog struct {
	mu         sync.Mutex
	w          io.Writer
	burst      int
	window     time.Duration
	start      time.Time
	written    int
	suppressed int
	now        func() time.Time
}

func newRateLimitedLog(w io.Writer, burst int, window time.Duration) *rateLimitedLog {
	return &rateLimitedLog{w: w, burst: burst, window: window, now: time.Now}
}

func (l *rateLimitedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Sub(l.start) >= l.window {
		if l.suppressed > 0 {
			_, _ = fmt.Fprintf(l.w, "api: %d more connection errors were not logged (at most %d every %s)\n", l.suppressed, l.burst, l.window)
		}
		l.start, l.written, l.suppressed = now, 0, 0
	}
	if l.written >= l.burst {
		l.suppressed++
		return len(p), nil
	}
	l.written++
	_, err := l.w.Write(p)
	return len(p), err
}
