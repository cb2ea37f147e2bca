package platform

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"kiln/machined/internal/safefile"
)

// Limits on one answer. Metadata documents are a few KiB; the clouds cap user data at 16 KiB
// (AWS) to 256 KiB (GCP), so 16 MiB leaves room for any of them while a hostile or broken
// service still cannot make PID 1 run out of memory. A larger answer is an error, never
// silently cut.
const (
	MaxDocument = 1 << 20
	MaxUserData = 16 << 20
)

// Retry policy: each request gets a few seconds; connection errors, 429 and 5xx are retried
// with exponential backoff (the service may still be coming up with the network), 404 and
// other 4xx are answers and are not retried. The whole Fetch is bounded by Env.Deadline.
var requestTimeout = 5 * time.Second // a var only so that a test can give a slow machine longer

const (
	maxAttempts  = 8
	firstBackoff = 250 * time.Millisecond
	maxBackoff   = 5 * time.Second
)

// errNotFound is a 404: for user data it means "none", for other documents it is an error.
var errNotFound = errors.New("not found (HTTP 404)")

// statusError is an answer that is neither 2xx nor 404.
type statusError struct{ code int }

func (e statusError) Error() string {
	return fmt.Sprintf("HTTP %d %s", e.code, http.StatusText(e.code))
}

// fetcher makes bounded requests to one platform's services.
type fetcher struct {
	platform string
	base     string // metadata service, without a trailing slash
	client   *http.Client
	sleep    func(context.Context, time.Duration) error
	// check vets every answer before its status is looked at (GCP's Metadata-Flavor).
	check func(*http.Response) error
	// retryStatus adds statuses a service documents as "try again" (Azure IMDS's 410).
	retryStatus []int
}

func newFetcher(platform string, env Env) (*fetcher, error) {
	base, err := serviceURL(env.BaseURL, MetadataURL)
	if err != nil {
		return nil, fmt.Errorf("%s: BaseURL: %v", platform, err)
	}
	return &fetcher{platform: platform, base: base, client: boundedClient(env.Client), sleep: sleeper(env.Sleep)}, nil
}

// fromService reads a platform's facts from its metadata service: read gets a fetcher for
// it, and the whole read is bounded by env.Deadline.
func fromService(ctx context.Context, env Env, platform string, read func(context.Context, *fetcher) (Facts, error)) (Facts, error) {
	ctx, cancel := env.withDeadline(ctx)
	defer cancel()
	fe, err := newFetcher(platform, env)
	if err != nil {
		return Facts{}, err
	}
	return read(ctx, fe)
}

// documentService is a metadata service whose facts are one document, parsed by parse; the
// user data is in that document or, where userData names one, in a document of its own
// (absent, 404, when there is none).
type documentService struct {
	noReadyReport
	name     string
	document string // path below the service's address, as the errors name it
	parse    func([]byte) (*facts, error)
	userData string
}

func (s documentService) Name() string { return s.name }

func (s documentService) Fetch(ctx context.Context, env Env) (Facts, error) {
	return fromService(ctx, env, s.name, func(ctx context.Context, fe *fetcher) (Facts, error) {
		body, err := fe.get(ctx, "/"+s.document, s.document, MaxDocument, nil)
		if err != nil {
			return Facts{}, err
		}
		f, err := s.parse(body)
		if err != nil {
			return Facts{}, err
		}
		if s.userData != "" {
			userData, err := fe.get(ctx, "/"+s.userData, s.userData, MaxUserData, nil)
			if err != nil && !errors.Is(err, errNotFound) {
				return Facts{}, err
			}
			f.setUserData(userData)
		}
		f.Source = s.name + " metadata " + fe.base
		return f.Facts, nil
	})
}

// serviceURL validates an override of a service address (or takes the default).
func serviceURL(override, def string) (string, error) {
	if override == "" {
		return def, nil
	}
	u, err := url.Parse(override)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q is not an http(s) URL", override)
	}
	return strings.TrimRight(override, "/"), nil
}

// boundedClient copies c (or makes a client) with a redirect policy that stays on one host:
// a metadata answer redirecting elsewhere would send the token headers along.
func boundedClient(c *http.Client) *http.Client {
	var out http.Client
	if c != nil {
		out = *c
	} else {
		out.Transport = &http.Transport{
			Proxy:                  nil, // link-local services: never through an HTTP proxy
			DialContext:            (&net.Dialer{Timeout: 3 * time.Second}).DialContext,
			ResponseHeaderTimeout:  requestTimeout,
			MaxResponseHeaderBytes: 64 << 10,
			DisableKeepAlives:      true, // a handful of requests at boot; no idle connections left over
		}
	}
	out.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 3 {
			return redirectError("more than 3 redirects")
		}
		if req.URL.Host != via[0].URL.Host || req.URL.Scheme != via[0].URL.Scheme {
			return redirectError(fmt.Sprintf("redirect to %s://%s refused (only the same host is followed)", req.URL.Scheme, req.URL.Host))
		}
		return nil
	}
	return &out
}

// redirectError is a redirect the policy refused: asking again will not help.
type redirectError string

func (e redirectError) Error() string { return string(e) }

// sleeper wraps an injected Sleep so that a retry loop still ends with its context.
func sleeper(sleep func(time.Duration)) func(context.Context, time.Duration) error {
	if sleep != nil {
		return func(ctx context.Context, d time.Duration) error {
			sleep(d)
			return ctx.Err()
		}
	}
	return func(ctx context.Context, d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// request is one call; doc names it in errors ("meta-data/instance-id").
type request struct {
	method string // "" is GET
	url    string // absolute; "" means the fetcher's base + path
	path   string
	header map[string]string
	body   []byte
	limit  int64 // 0 is MaxDocument
	doc    string
}

// get is the common case: a GET of a path on the metadata service.
func (f *fetcher) get(ctx context.Context, path, doc string, limit int64, header map[string]string) ([]byte, error) {
	return f.do(ctx, request{path: path, doc: doc, limit: limit, header: header})
}

// do makes the request, retrying what may be passing. The error names the platform and the
// document; errors.Is(err, errNotFound) tells a 404.
func (f *fetcher) do(ctx context.Context, r request) ([]byte, error) {
	if r.limit <= 0 {
		r.limit = MaxDocument
	}
	if r.url == "" {
		r.url = f.base + r.path
	}
	backoff := firstBackoff
	for attempt := 1; ; attempt++ {
		body, retry, err := f.once(ctx, r)
		if err == nil {
			return body, nil
		}
		if !retry {
			return nil, docError(f.platform, r.doc, err)
		}
		if attempt == maxAttempts {
			return nil, docError(f.platform, r.doc, fmt.Errorf("%w (gave up after %d attempts)", err, attempt))
		}
		if ctx.Err() != nil || f.sleep(ctx, backoff) != nil {
			return nil, docError(f.platform, r.doc, fmt.Errorf("%w (deadline reached after %d attempts)", err, attempt))
		}
		if backoff *= 2; backoff > maxBackoff {
			backoff = maxBackoff
		}
	}
}

// once makes one attempt; retry says whether another may do better.
func (f *fetcher) once(ctx context.Context, r request) (body []byte, retry bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	method := r.method
	if method == "" {
		method = http.MethodGet
	}
	var reqBody io.Reader
	if r.body != nil {
		reqBody = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.url, reqBody)
	if err != nil {
		return nil, false, err
	}
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		var refused redirectError
		if errors.As(err, &refused) {
			return nil, false, refused
		}
		return nil, true, err // connection refused, reset, timeout: the service may be starting
	}
	defer resp.Body.Close()
	if f.check != nil {
		if err := f.check(resp); err != nil {
			return nil, false, err
		}
	}
	for _, code := range f.retryStatus {
		if resp.StatusCode == code {
			return nil, true, statusError{code}
		}
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, false, errNotFound
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return nil, true, statusError{resp.StatusCode}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, false, statusError{resp.StatusCode}
	}
	body, err = readLimited(resp.Body, resp.ContentLength, r.limit)
	if err != nil {
		return nil, !errors.Is(err, errTooLarge), err
	}
	return body, false, nil
}

var errTooLarge = errors.New("answer too large")

// readLimited reads at most limit bytes; more is an error (never a silent truncation), and an
// announced length over the limit is refused before anything is read.
func readLimited(r io.Reader, length, limit int64) ([]byte, error) {
	if length > limit {
		return nil, fmt.Errorf("%w: %d bytes announced, the limit is %d", errTooLarge, length, limit)
	}
	data, err := safefile.ReadAtMost(r, limit)
	if errors.Is(err, safefile.ErrTooLarge) {
		return nil, fmt.Errorf("%w: more than the %d bytes allowed", errTooLarge, limit)
	}
	return data, err
}
