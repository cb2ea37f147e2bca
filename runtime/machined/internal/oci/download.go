package oci

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"

	"kiln/machined/internal/redact"
)

// Download fetches an http(s) URL (an OCI layout tarball) to dest, failing if it is larger
// than max bytes. A plain-http URL is refused unless insecure; roots, when set, replace the
// system's CAs for https. dest is removed on any error, so a partial file is never mistaken
// for a download. The content is not trusted: Layout verifies every blob it serves.
func Download(ctx context.Context, rawURL, dest string, max int64, insecure bool, roots *x509.CertPool) (int64, error) {
	if max <= 0 {
		return 0, errors.New("download: max must be positive")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return 0, fmt.Errorf("download: bad URL: %v", redact.Error(err))
	}
	if err := checkScheme(u, insecure); err != nil {
		return 0, fmt.Errorf("download: %w", err)
	}
	client := newClient(insecure, roots, defaultTimeout)
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, fmt.Errorf("download: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("download %s: %w", redact.URL(u), transportError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("download: %w", statusError(resp))
	}
	if resp.ContentLength > max {
		return 0, fmt.Errorf("download %s: %d bytes, more than the %d allowed", redact.URL(u), resp.ContentLength, max)
	}
	f, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("download: %w", err)
	}
	n, err := io.Copy(f, io.LimitReader(resp.Body, max+1))
	if err == nil && n > max {
		err = fmt.Errorf("more than the %d bytes allowed", max)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dest)
		return 0, fmt.Errorf("download %s: %w", redact.URL(u), err)
	}
	return n, nil
}
