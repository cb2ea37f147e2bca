package oci

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"kiln/machined/internal/redact"
)

const (
	maxTags     = 10000
	maxTagsPage = 4 << 20
	maxTagPages = 1000
)

// manifestAccept lists what Resolve understands; a registry otherwise may convert to (or only
// offer) Docker schema1, which carries no config digest and is refused.
var manifestAccept = strings.Join([]string{MediaTypeIndex, MediaTypeManifest, MediaTypeDockerList, MediaTypeDockerManifest}, ", ")

// Registry pulls anonymously from one repository of an OCI distribution API registry. Use it
// through a pointer; it caches its HTTP client and bearer token.
type Registry struct {
	Host      string         // host[:port]
	Repo      string         // repository path
	Insecure  bool           // plain http (for a lab registry), else https
	RootCAs   *x509.CertPool // for https; nil means the system's
	Timeout   time.Duration  // per request: connect, TLS and response headers; 0 means 30 s
	UserAgent string         // sent when set

	once   sync.Once
	client *http.Client
	mu     sync.Mutex
	token  string
}

func (r *Registry) httpClient() *http.Client {
	r.once.Do(func() { r.client = newClient(r.Insecure, r.RootCAs, r.Timeout) })
	return r.client
}

// endpoint is the URL of /v2/<repo>/<suffix>, after checking Host and Repo (configuration, but
// they go into a URL).
func (r *Registry) endpoint(suffix string) (string, error) {
	if err := checkHost(r.Host); err != nil {
		return "", err
	}
	if err := checkRepo(r.Repo); err != nil {
		return "", err
	}
	scheme := "https"
	if r.Insecure {
		scheme = "http"
	}
	return scheme + "://" + r.Host + "/v2/" + r.Repo + "/" + suffix, nil
}

// get performs a GET through authorized; non-2xx answers become errors.
func (r *Registry) get(ctx context.Context, u, accept string) (*http.Response, error) {
	resp, err := r.authorized(ctx, u, accept)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		err := statusError(resp)
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// authorized performs a GET with the distribution API's anonymous token dance: on a 401 carrying
// a Bearer challenge it fetches a token from the realm and retries once. The token is kept for
// later requests and replaced when one is refused. Any other status is the caller's to judge.
func (r *Registry) authorized(ctx context.Context, u, accept string) (*http.Response, error) {
	r.mu.Lock()
	tok := r.token
	r.mu.Unlock()
	resp, err := r.send(ctx, u, accept, tok)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		return resp, err
	}
	ch, ok := bearerChallenge(resp.Header)
	drainClose(resp)
	if !ok {
		return nil, fmt.Errorf("GET %s: 401 Unauthorized without a Bearer challenge (machined pulls anonymously)", stripQuery(u))
	}
	if tok, err = r.fetchToken(ctx, ch); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.token = tok
	r.mu.Unlock()
	return r.send(ctx, u, accept, tok)
}

func (r *Registry) send(ctx context.Context, u, accept, tok string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if r.UserAgent != "" {
		req.Header.Set("User-Agent", r.UserAgent)
	}
	resp, err := r.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", stripQuery(u), transportError(err))
	}
	return resp, nil
}

func stripQuery(u string) string {
	if i := strings.IndexAny(u, "?#"); i >= 0 {
		return u[:i]
	}
	return u
}

// Resolve returns the image for ref: a tag, a digest, "tag@digest" (the digest wins) or ""
// (meaning "latest"). An index is followed to platform's manifest. When ref holds a digest, the
// document fetched by it must hash to it; a manifest reached through an index must match the
// index entry's digest and size.
func (r *Registry) Resolve(ctx context.Context, ref string, platform Platform) (Image, error) {
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		ref = ref[i+1:]
	}
	var want string
	switch {
	case ref == "":
		ref = "latest"
	case ValidDigest(ref):
		want = ref
	case strings.Contains(ref, ":"):
		return Image{}, fmt.Errorf("%s is neither a tag nor a sha256 digest", quote(ref))
	case !tagPattern.MatchString(ref):
		return Image{}, fmt.Errorf("tag %s is not [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", quote(ref))
	}
	body, contentType, err := r.manifest(ctx, ref)
	if err != nil {
		return Image{}, err
	}
	if want != "" {
		if got := digestOf(body); got != want {
			return Image{}, fmt.Errorf("%s/%s@%s: the registry's manifest hashes to %s", r.Host, r.Repo, want, got)
		}
	}
	img, err := resolveImage(ctx, r, body, contentType, platform, r.manifestFor)
	if err != nil {
		sep := ":"
		if want != "" {
			sep = "@"
		}
		return Image{}, fmt.Errorf("%s/%s%s%s: %w", r.Host, r.Repo, sep, ref, err)
	}
	return img, nil
}

// manifest fetches /v2/<repo>/manifests/<ref>, at most 4 MiB.
func (r *Registry) manifest(ctx context.Context, ref string) ([]byte, string, error) {
	u, err := r.endpoint("manifests/" + ref)
	if err != nil {
		return nil, "", err
	}
	resp, err := r.get(ctx, u, manifestAccept)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	if resp.ContentLength > maxManifestBytes {
		return nil, "", fmt.Errorf("manifest %s is %d bytes, more than the %d allowed", quote(ref), resp.ContentLength, maxManifestBytes)
	}
	body, err := readLimited(resp.Body, maxManifestBytes, "manifest "+quote(ref))
	if err != nil {
		return nil, "", err
	}
	return body, resp.Header.Get("Content-Type"), nil
}

// manifestFor fetches the manifest an index entry points at and checks it against the entry.
func (r *Registry) manifestFor(ctx context.Context, d Descriptor) ([]byte, string, error) {
	if d.Size > maxManifestBytes {
		return nil, "", fmt.Errorf("manifest %s is %d bytes, more than the %d allowed", d.Digest, d.Size, maxManifestBytes)
	}
	body, contentType, err := r.manifest(ctx, d.Digest)
	if err != nil {
		return nil, "", err
	}
	if err := checkFetched(body, d); err != nil {
		return nil, "", err
	}
	return body, contentType, nil
}

// Blob streams /v2/<repo>/blobs/<digest>, following redirects (registries send blobs from
// object storage; Go drops the Authorization header when a redirect leaves the host). The
// reader verifies size and digest as it goes.
func (r *Registry) Blob(ctx context.Context, desc Descriptor) (io.ReadCloser, error) {
	if err := checkDigestSize(desc); err != nil {
		return nil, err
	}
	u, err := r.endpoint("blobs/" + desc.Digest)
	if err != nil {
		return nil, err
	}
	resp, err := r.get(ctx, u, "")
	if err != nil {
		return nil, err
	}
	if resp.ContentLength >= 0 && resp.ContentLength != desc.Size {
		resp.Body.Close()
		return nil, fmt.Errorf("blob %s: the registry sends %d bytes, its descriptor says %d", desc.Digest, resp.ContentLength, desc.Size)
	}
	return newVerifier(resp.Body, desc), nil
}

// Tags lists the repository's tags (GET /v2/<repo>/tags/list), following Link rel="next"
// pages on the same registry, at most 10000 tags. Every tag must be well-formed.
func (r *Registry) Tags(ctx context.Context) ([]string, error) {
	next, err := r.endpoint("tags/list")
	if err != nil {
		return nil, err
	}
	base, err := url.Parse(next)
	if err != nil {
		return nil, err
	}
	var tags []string
	seen := map[string]bool{}
	for page := 0; next != ""; page++ {
		if page >= maxTagPages || seen[next] {
			return nil, fmt.Errorf("tags of %s/%s: pagination does not end", r.Host, r.Repo)
		}
		seen[next] = true
		var more []string
		more, next, err = r.tagsPage(ctx, next, base)
		if err != nil {
			return nil, fmt.Errorf("tags of %s/%s: %w", r.Host, r.Repo, err)
		}
		if len(tags)+len(more) > maxTags {
			return nil, fmt.Errorf("tags of %s/%s: more than %d", r.Host, r.Repo, maxTags)
		}
		if len(more) == 0 && next != "" {
			return nil, fmt.Errorf("tags of %s/%s: an empty page links to another", r.Host, r.Repo)
		}
		tags = append(tags, more...)
	}
	return tags, nil
}

// tagsPage fetches one page and returns its tags and the next page's URL ("" at the end).
func (r *Registry) tagsPage(ctx context.Context, u string, base *url.URL) ([]string, string, error) {
	resp, err := r.get(ctx, u, "application/json")
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := readLimited(resp.Body, maxTagsPage, "tag list")
	if err != nil {
		return nil, "", err
	}
	var list struct {
		Tags []string `json:"tags"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, "", fmt.Errorf("tag list is not JSON: %v", err)
	}
	for _, t := range list.Tags {
		if !tagPattern.MatchString(t) {
			return nil, "", fmt.Errorf("the registry lists a malformed tag %s", quote(t))
		}
	}
	next, err := nextLink(resp.Header.Values("Link"), resp.Request.URL, base)
	return list.Tags, next, err
}

// nextLink finds the rel="next" target among Link headers, resolved against the page's URL.
// It must stay on the registry (same scheme and host): the bearer token goes with it.
func nextLink(links []string, page, base *url.URL) (string, error) {
	for _, header := range links {
		for _, link := range strings.Split(header, ",") {
			link = strings.TrimSpace(link)
			if !strings.HasPrefix(link, "<") {
				continue
			}
			end := strings.IndexByte(link, '>')
			if end < 0 {
				continue
			}
			target, params := link[1:end], link[end+1:]
			isNext := false
			for _, p := range strings.Split(params, ";") {
				p = strings.ReplaceAll(strings.TrimSpace(p), " ", "")
				if strings.EqualFold(p, `rel="next"`) || strings.EqualFold(p, "rel=next") {
					isNext = true
				}
			}
			if !isNext {
				continue
			}
			t, err := page.Parse(target)
			if err != nil {
				return "", fmt.Errorf("bad next link %s: %v", quote(redact.String(target)), redact.Error(err))
			}
			if t.Scheme != base.Scheme || t.Host != base.Host {
				return "", fmt.Errorf("next link %s leaves the registry", quote(redact.URL(t)))
			}
			return t.String(), nil
		}
	}
	return "", nil
}
