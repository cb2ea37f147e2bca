package oci

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"kiln/machined/internal/redact"
)

// ErrNoRanges is returned (wrapped) by OpenRemoteLayout when the server does not answer a
// byte-range request with 206 Partial Content.
var ErrNoRanges = errors.New("the server does not serve byte ranges")

const (
	rangeBlock       = 16 << 10 // what one small read (a tar header, index.json) fetches
	maxRangeRequests = 4096     // requests for one tarball, small reads and blobs together
)

// OpenRemoteLayout serves the OCI layout tarball at an http(s) URL without downloading it: the
// tar is indexed from its headers and every member is read with HTTP byte-range requests, so
// index.json, the manifests and a signature can be checked before any layer is fetched, and
// layers nobody asks for (the disk image) are never fetched. At most max bytes are fetched in
// all, and the tarball may be at most max bytes. A server that ignores Range is refused with an
// error wrapping ErrNoRanges; one whose answers disagree (another total size, another range)
// fails the read that got it. Every blob is verified by Layout as from a local tar.
func OpenRemoteLayout(ctx context.Context, rawURL string, max int64, insecure bool, roots *x509.CertPool) (*Layout, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("layout URL: %v", redact.Error(err)) // url.Parse quotes the whole URL
	}
	if err := checkScheme(u, insecure); err != nil {
		return nil, fmt.Errorf("layout URL: %w", err)
	}
	r := &httpRanges{ctx: ctx, client: newClient(insecure, roots, defaultTimeout), url: u, max: max}
	if err := r.probe(); err != nil {
		r.Close()
		return nil, fmt.Errorf("%s: %w", redact.URL(u), err)
	}
	l := &Layout{f: r, size: r.size, members: map[string]member{}}
	if err := l.load(); err != nil {
		r.Close()
		return nil, fmt.Errorf("OCI layout %s: %w", redact.URL(u), err)
	}
	return l, nil
}

// httpRanges reads a remote file by byte ranges: an io.ReaderAt for the tar index and small
// members (through a one-block cache), and OpenRange for blobs (one request each).
type httpRanges struct {
	ctx    context.Context
	client *http.Client
	url    *url.URL
	max    int64

	mu       sync.Mutex
	size     int64
	fetched  int64
	requests int
	cacheOff int64
	cache    []byte
}

func (r *httpRanges) Close() error {
	r.client.CloseIdleConnections()
	return nil
}

// probe learns the size from the first block's Content-Range.
func (r *httpRanges) probe() error {
	r.size = -1
	rc, total, err := r.get(0, rangeBlock, true)
	if err != nil {
		return err
	}
	defer rc.Close()
	if total > r.max {
		return fmt.Errorf("%d bytes, more than the %d allowed", total, r.max)
	}
	r.size = total
	n := int64(rangeBlock)
	if total < n {
		n = total
	}
	b, err := readExactly(rc, n)
	if err != nil {
		return err
	}
	r.cacheOff, r.cache = 0, b
	return nil
}

// get asks for n bytes at off (fewer at the end of the file) and returns the body and the total
// size the server states. probing: the size is not known yet.
func (r *httpRanges) get(off, n int64, probing bool) (io.ReadCloser, int64, error) {
	r.mu.Lock()
	if r.requests >= maxRangeRequests {
		r.mu.Unlock()
		return nil, 0, fmt.Errorf("more than %d range requests", maxRangeRequests)
	}
	if r.fetched+n > r.max {
		r.mu.Unlock()
		return nil, 0, fmt.Errorf("more than the %d bytes allowed would be fetched", r.max)
	}
	r.requests++
	r.fetched += n
	size := r.size
	r.mu.Unlock()
	if !probing && off+n > size {
		n = size - off
	}
	req, err := http.NewRequestWithContext(r.ctx, http.MethodGet, r.url.String(), nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, 0, transportError(err)
	}
	if resp.StatusCode == http.StatusOK {
		resp.Body.Close()
		return nil, 0, ErrNoRanges
	}
	if resp.StatusCode != http.StatusPartialContent {
		defer resp.Body.Close()
		return nil, 0, statusError(resp)
	}
	first, last, total, err := ParseContentRange(resp.Header.Get("Content-Range"))
	if err == nil && !probing && total != size {
		err = fmt.Errorf("the file is %d bytes now, %d before", total, size)
	}
	if err == nil && (first != off || (last != off+n-1 && !(probing && last == total-1 && total < n))) {
		err = fmt.Errorf("asked for bytes %d-%d, got %d-%d", off, off+n-1, first, last)
	}
	if err != nil {
		resp.Body.Close()
		return nil, 0, err
	}
	return resp.Body, total, nil
}

// ReadAt serves small reads from a cached block, larger ones with a request of their own.
func (r *httpRanges) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= r.size {
		return 0, io.EOF
	}
	want := int64(len(p))
	short := off+want > r.size
	if short {
		want = r.size - off
	}
	r.mu.Lock()
	if off >= r.cacheOff && off+want <= r.cacheOff+int64(len(r.cache)) {
		n := copy(p[:want], r.cache[off-r.cacheOff:])
		r.mu.Unlock()
		return n, eofIf(short)
	}
	r.mu.Unlock()
	n := want
	if n < rangeBlock {
		n = rangeBlock
		if off+n > r.size {
			n = r.size - off
		}
	}
	rc, _, err := r.get(off, n, false)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	b, err := readExactly(rc, n)
	if err != nil {
		return 0, err
	}
	if n <= rangeBlock {
		r.mu.Lock()
		r.cacheOff, r.cache = off, b
		r.mu.Unlock()
	}
	return copy(p[:want], b), eofIf(short)
}

// OpenRange streams n bytes at off with one request (a blob).
func (r *httpRanges) OpenRange(off, n int64) (io.ReadCloser, error) {
	if n == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	rc, _, err := r.get(off, n, false)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(rc, n), rc}, nil
}

func eofIf(b bool) error {
	if b {
		return io.EOF
	}
	return nil
}

// readExactly reads n bytes, no fewer, and refuses a body longer than that.
func readExactly(r io.Reader, n int64) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("a range of %d bytes: %v", n, err)
	}
	var extra [1]byte
	if m, _ := r.Read(extra[:]); m > 0 {
		return nil, fmt.Errorf("a range of %d bytes came with more", n)
	}
	return b, nil
}

// ParseContentRange reads "bytes FIRST-LAST/TOTAL" (RFC 9110, 14.4) of a 206 answer: decimal,
// FIRST <= LAST < TOTAL; the unsatisfied form and an unknown total ("*") are refused.
func ParseContentRange(v string) (first, last, total int64, err error) {
	bad := fmt.Errorf("Content-Range %s is not bytes FIRST-LAST/TOTAL", quote(v))
	if !strings.HasPrefix(v, "bytes ") {
		return 0, 0, 0, bad
	}
	span, size, ok := strings.Cut(v[len("bytes "):], "/")
	if !ok {
		return 0, 0, 0, bad
	}
	a, b, ok := strings.Cut(span, "-")
	if !ok {
		return 0, 0, 0, bad
	}
	nums := []*int64{&first, &last, &total}
	for i, s := range []string{a, b, size} {
		if s == "" || len(s) > 18 || strings.TrimLeft(s, "0123456789") != "" {
			return 0, 0, 0, bad
		}
		n, perr := strconv.ParseInt(s, 10, 64)
		if perr != nil {
			return 0, 0, 0, bad
		}
		*nums[i] = n
	}
	if first > last || last >= total {
		return 0, 0, 0, bad
	}
	return first, last, total, nil
}
