package oci

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"kiln/machined/internal/redact"
)

const (
	defaultTimeout = 30 * time.Second
	maxErrorBody   = 4 << 10
	maxRedirects   = 10
)

// newClient builds the HTTP client for registries and downloads. Timeout bounds connecting,
// the TLS handshake and the wait for response headers, not the body: a multi-gigabyte layer
// takes as long as it takes, and the caller's context ends it. Redirects may not downgrade to
// plain http unless insecure. No proxy from the environment: PID 1 has none to honour.
func newClient(insecure bool, roots *x509.CertPool, timeout time.Duration) *http.Client {
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		DialContext:            dialer.DialContext,
		TLSClientConfig:        &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           4,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &http.Client{
		Transport: transport,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= maxRedirects {
				return fmt.Errorf("stopped after %d redirects", maxRedirects)
			}
			return checkScheme(req.URL, insecure)
		},
	}
}

// checkScheme allows https, and http only when insecure was asked for.
func checkScheme(u *url.URL, insecure bool) error {
	switch u.Scheme {
	case "https":
	case "http":
		if !insecure {
			return fmt.Errorf("refusing plain http URL %s: it is only allowed for a registry marked insecure", redact.URL(u))
		}
	default:
		return fmt.Errorf("URL %s: scheme must be http or https", quote(redact.URL(u)))
	}
	if u.Host == "" {
		return fmt.Errorf("URL %s has no host", quote(redact.URL(u)))
	}
	return nil
}

// statusError describes a failed response, with the registry's error code and message when its
// body has them (the distribution spec's {"errors":[{"code","message"}]}), sanitised.
func statusError(resp *http.Response) error {
	what := "GET"
	if resp.Request != nil && resp.Request.URL != nil {
		what += " " + redact.URL(resp.Request.URL)
	}
	msg := fmt.Sprintf("%s: %d %s", what, resp.StatusCode, http.StatusText(resp.StatusCode))
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var e struct {
		Errors []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	if json.Unmarshal(body, &e) == nil && len(e.Errors) > 0 {
		msg += ": " + printable(e.Errors[0].Code+" "+e.Errors[0].Message)
	}
	return errors.New(msg)
}

// printable keeps a server's words to one short line of printable ASCII.
func printable(s string) string {
	var b strings.Builder
	for _, c := range s {
		if b.Len() >= 200 {
			b.WriteString("...")
			break
		}
		if c >= 0x20 && c < 0x7f {
			b.WriteRune(c)
		} else {
			b.WriteByte('?')
		}
	}
	return strings.TrimSpace(b.String())
}

// transportError drops the *url.Error wrapper, whose text repeats the full URL (query
// included); callers name the URL themselves, redacted.
func transportError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// drainClose reads a little of an unwanted body so the connection can be reused, then closes it.
func drainClose(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, maxErrorBody)
	resp.Body.Close()
}
