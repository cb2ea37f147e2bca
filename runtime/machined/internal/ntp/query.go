package ntp

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"kiln/machined/internal/safego"
)

// defaultTimeout bounds one query, DNS lookup included.
const defaultTimeout = 2 * time.Second

// serverAddr turns "host" or "host:port" (IPv6 literals bare or bracketed) into a dial address.
func serverAddr(server string) string {
	s := strings.TrimSpace(server)
	if host, port, err := net.SplitHostPort(s); err == nil {
		if port == "" {
			port = "123"
		}
		return net.JoinHostPort(host, port)
	}
	return net.JoinHostPort(strings.Trim(s, "[]"), "123")
}

// nonce returns a random, non-zero transmit timestamp. Should the kernel's random source
// fail, the time is used: matching replies still works, only spoofing gets easier.
func nonce() ntpTime {
	var b [8]byte
	v := uint64(time.Now().UnixNano())
	if _, err := rand.Read(b[:]); err == nil {
		v = binary.BigEndian.Uint64(b[:])
	}
	if v == 0 {
		v = 1
	}
	return ntpTime(v)
}

// Query asks server once, using the system clock.
func Query(ctx context.Context, server string) (Sample, error) {
	return query(ctx, server, time.Now, defaultTimeout)
}

// query sends one request over a connected UDP socket (so the kernel drops datagrams
// from other addresses) and waits up to timeout for the reply. Packets that are not the
// answer to this request are skipped; the first answer is accepted or refused.
func query(ctx context.Context, server string, now func() time.Time, timeout time.Duration) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", serverAddr(server))
	if err != nil {
		return Sample{}, fmt.Errorf("%s: %w", server, err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	stop := make(chan struct{})
	defer close(stop)
	safego.Go("ntp query cancel", func() {
		select {
		case <-ctx.Done():
			_ = conn.SetDeadline(time.Unix(1, 0)) // wake the read at once
		case <-stop:
		}
	})

	sent := nonce()
	t1 := now()
	if _, err := conn.Write(request(sent)); err != nil {
		return Sample{}, fmt.Errorf("%s: %w", server, bare(err))
	}
	buf := make([]byte, 1024)
	var skipped error
	for {
		n, err := conn.Read(buf)
		t4 := now()
		if err != nil {
			var ne net.Error
			switch {
			case skipped != nil:
				return Sample{}, fmt.Errorf("%s: no valid reply (%v)", server, skipped)
			case errors.As(err, &ne) && ne.Timeout():
				return Sample{}, fmt.Errorf("%s: no reply within %v", server, timeout)
			}
			return Sample{}, fmt.Errorf("%s: %w", server, bare(err))
		}
		p, err := parsePacket(buf[:n])
		if err != nil {
			skipped = err
			continue
		}
		if err := checkReply(p, sent); err != nil {
			if errors.Is(err, errOriginMismatch) {
				skipped = err
				continue
			}
			return Sample{}, fmt.Errorf("%s: %w", server, err)
		}
		s, err := newSample(server, p, t1, t4)
		if err != nil {
			return Sample{}, fmt.Errorf("%s: %w", server, err)
		}
		s.Addr = conn.RemoteAddr().String()
		return s, nil
	}
}

// bare drops the socket addresses from a network error ("read: connection refused"):
// the local port changes with every query and would make each failure look new.
func bare(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}
