package oci

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeRegistry is a real HTTP server (net/http/httptest) standing in for an OCI distribution
// registry: it serves /v2/<repo>/manifests/<tag|digest>, /blobs/<digest> and /tags/list as the
// distribution spec describes, with optional anonymous bearer-token auth (its own /token realm),
// blob redirects to a second "storage" server, paginated tags and a few ways to misbehave.
type fakeRegistry struct {
	t         *testing.T
	repo      string
	manifests map[string][]byte // by tag or digest
	types     map[string]string // Content-Type override by tag or digest
	blobs     map[string][]byte // by digest; a test may store wrong bytes
	tags      []string
	pageSize  int    // 0: all tags on one page
	nextHost  string // when set, the tags Link points at this host instead
	token     string // when set, /v2 requests need "Authorization: Bearer <token>"
	realm     string // overrides the challenge's realm
	basicOnly bool   // answer 401 with a Basic challenge
	chunked   bool   // send bodies without Content-Length
	redirect  bool   // send blobs from the storage server

	srv, storage *httptest.Server
	mu           sync.Mutex
	accepts      []string     // Accept headers of manifest requests
	tokenQueries []url.Values // queries the token realm got
	storageAuth  []string     // Authorization headers the storage server got
	requests     int
}

func newFakeRegistry(t *testing.T, img *testImage) *fakeRegistry {
	f := &fakeRegistry{
		t: t, repo: "kiln/installer",
		manifests: map[string][]byte{}, types: map[string]string{}, blobs: map[string][]byte{},
	}
	if img != nil {
		f.manifests["1.2.0"] = img.index
		for _, b := range [][]byte{img.index, img.manifest, img.otherManifest} {
			f.manifests[digestOf(b)] = b
		}
		for d, b := range img.blobs {
			f.blobs[d] = b
		}
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	f.storage = httptest.NewServer(http.HandlerFunc(f.serveStorage))
	t.Cleanup(f.srv.Close)
	t.Cleanup(f.storage.Close)
	return f
}

func (f *fakeRegistry) registry() *Registry {
	return &Registry{Host: strings.TrimPrefix(f.srv.URL, "http://"), Repo: f.repo, Insecure: true}
}

func (f *fakeRegistry) send(w http.ResponseWriter, contentType string, body []byte) {
	if contentType != "" {
		w.Header().Set("Content-Type", contentType)
	}
	if f.chunked {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
	} else {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.Write(body)
}

func registryError(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"errors":[{"code":%q,"message":"fake registry says no\u0007"}]}`, code)
}

func (f *fakeRegistry) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	f.mu.Unlock()
	if r.URL.Path == "/token" {
		f.mu.Lock()
		f.tokenQueries = append(f.tokenQueries, r.URL.Query())
		f.mu.Unlock()
		w.Write(mustJSON(f.t, map[string]string{"access_token": f.token}))
		return
	}
	if f.basicOnly && r.Header.Get("Authorization") == "" {
		w.Header().Set("WWW-Authenticate", `Basic realm="fake"`)
		registryError(w, http.StatusUnauthorized, "UNAUTHORIZED")
		return
	}
	if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
		realm := f.realm
		if realm == "" {
			realm = "http://" + r.Host + "/token"
		}
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm=%q,service="fake",scope="repository:%s:pull"`, realm, f.repo))
		registryError(w, http.StatusUnauthorized, "UNAUTHORIZED")
		return
	}
	prefix := "/v2/" + f.repo + "/"
	if !strings.HasPrefix(r.URL.Path, prefix) {
		registryError(w, http.StatusNotFound, "NAME_UNKNOWN")
		return
	}
	rest := strings.TrimPrefix(r.URL.Path, prefix)
	switch {
	case strings.HasPrefix(rest, "manifests/"):
		ref := strings.TrimPrefix(rest, "manifests/")
		f.mu.Lock()
		f.accepts = append(f.accepts, r.Header.Get("Accept"))
		f.mu.Unlock()
		body, ok := f.manifests[ref]
		if !ok {
			registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN")
			return
		}
		ct, ok := f.types[ref]
		if !ok {
			var p struct {
				MediaType string `json:"mediaType"`
			}
			json.Unmarshal(body, &p)
			ct = p.MediaType
		}
		f.send(w, ct, body)
	case strings.HasPrefix(rest, "blobs/"):
		d := strings.TrimPrefix(rest, "blobs/")
		if _, ok := f.blobs[d]; !ok {
			registryError(w, http.StatusNotFound, "BLOB_UNKNOWN")
			return
		}
		if f.redirect {
			http.Redirect(w, r, f.storage.URL+"/storage/"+d+"?X-Signature=secret", http.StatusTemporaryRedirect)
			return
		}
		f.send(w, "application/octet-stream", f.blobs[d])
	case rest == "tags/list":
		f.serveTags(w, r)
	default:
		registryError(w, http.StatusNotFound, "UNSUPPORTED")
	}
}

func (f *fakeRegistry) serveTags(w http.ResponseWriter, r *http.Request) {
	tags := f.tags
	if last := r.URL.Query().Get("last"); last != "" {
		for i, t := range tags {
			if t == last {
				tags = tags[i+1:]
				break
			}
		}
	}
	if f.pageSize > 0 && len(tags) > f.pageSize {
		tags = tags[:f.pageSize]
		next := fmt.Sprintf("/v2/%s/tags/list?n=%d&last=%s", f.repo, f.pageSize, url.QueryEscape(tags[len(tags)-1]))
		if f.nextHost != "" {
			next = "http://" + f.nextHost + next
		}
		w.Header().Set("Link", fmt.Sprintf(`<%s>; rel="next"`, next))
	}
	f.send(w, "application/json", mustJSON(f.t, map[string]interface{}{"name": f.repo, "tags": tags}))
}

func (f *fakeRegistry) serveStorage(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.storageAuth = append(f.storageAuth, r.Header.Get("Authorization"))
	f.mu.Unlock()
	b, ok := f.blobs[strings.TrimPrefix(r.URL.Path, "/storage/")]
	if !ok || r.URL.Query().Get("X-Signature") != "secret" {
		http.NotFound(w, r)
		return
	}
	f.send(w, "application/octet-stream", b)
}

// unpackImage pulls and unpacks every layer of img from src the way machined will.
func unpackImage(t *testing.T, src Source, img Image) (string, error) {
	root := scratch(t)
	for _, l := range img.Manifest.Layers {
		rc, err := src.Blob(context.Background(), l)
		if err != nil {
			return root, err
		}
		_, err = Unpack(root, rc, l.MediaType, Limits{MaxBytes: 1 << 20, MaxEntries: 100})
		rc.Close()
		if err != nil {
			return root, err
		}
	}
	return root, nil
}

// resolveTestImage serves the test image from a fake registry and resolves its tag 1.2.0 for
// linux/amd64.
func resolveTestImage(t *testing.T) (*testImage, *fakeRegistry, *Registry, Image) {
	t.Helper()
	ti := newTestImage(t)
	f := newFakeRegistry(t, ti)
	reg, img := resolveFrom(t, f)
	return ti, f, reg, img
}

// resolveFrom resolves tag 1.2.0 for linux/amd64 from f.
func resolveFrom(t *testing.T, f *fakeRegistry) (*Registry, Image) {
	t.Helper()
	reg := f.registry()
	img, err := reg.Resolve(context.Background(), "1.2.0", amd64)
	if err != nil {
		t.Fatal(err)
	}
	return reg, img
}

// unpackFrom resolves tag 1.2.0 for linux/amd64 from f and unpacks it, through the registry
// client it returns.
func unpackFrom(t *testing.T, f *fakeRegistry) *Registry {
	t.Helper()
	reg, img := resolveFrom(t, f)
	if _, err := unpackImage(t, reg, img); err != nil {
		t.Fatal(err)
	}
	return reg
}

// verifyMangled publishes, in turn, every one-byte change of a good signature manifest raw
// (published for imageDigest already) and verifies each. A panic fails the test; an error or
// (for a change the checks do not look at) a success are both fine, since the payload and its
// signature are checked regardless.
func verifyMangled(t *testing.T, f *fakeRegistry, raw []byte, keys []crypto.PublicKey) {
	t.Helper()
	reg := f.registry()
	if _, err := VerifySignature(context.Background(), reg, imageDigest, keys); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(raw); i++ {
		for _, c := range []byte{'"', '{', '0', 'x', ']'} {
			m := append([]byte(nil), raw...)
			if m[i] == c {
				continue
			}
			m[i] = c
			f.manifests[SignatureTag(imageDigest)] = m
			_, _ = VerifySignature(context.Background(), reg, imageDigest, keys)
		}
	}
}

func TestRegistryResolveByTagThroughIndex(t *testing.T) {
	ti, f, reg, img := resolveTestImage(t)
	if img.Digest != digestOf(ti.manifest) {
		t.Fatalf("digest %s, want the amd64 manifest's %s", img.Digest, digestOf(ti.manifest))
	}
	if len(img.Manifest.Layers) != 2 || img.Config.Config.Entrypoint[0] != "/usr/bin/installer" || img.Config.Architecture != "amd64" {
		t.Fatalf("image %+v", img)
	}
	if got := img.Manifest.LayersByRole("boot"); len(got) != 1 || got[0].Digest != digestOf(ti.layers[1]) {
		t.Fatalf("boot layers %+v", got)
	}
	rel := ReleaseOf("1.2.0", img)
	if rel != (Release{Tag: "1.2.0", Version: "1.2.0", Channel: "beta", Architecture: "amd64"}) {
		t.Fatalf("release %+v", rel)
	}
	root, err := unpackImage(t, reg, img)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, "usr/bin/installer")); got != "#!installer\n" {
		t.Fatalf("installer %q", got)
	}
	if st, _ := os.Stat(filepath.Join(root, "usr/bin/installer")); st.Mode().Perm() != 0o755 {
		t.Fatalf("installer mode %v", st.Mode())
	}
	if got := readFile(t, filepath.Join(root, "boot/vmlinuz")); got != "kernel" {
		t.Fatalf("kernel %q", got)
	}
	for _, a := range f.accepts {
		for _, mt := range []string{MediaTypeIndex, MediaTypeManifest, MediaTypeDockerList, MediaTypeDockerManifest} {
			if !strings.Contains(a, mt) {
				t.Errorf("Accept %q lacks %s", a, mt)
			}
		}
	}
}

func TestRegistryResolveOtherPlatform(t *testing.T) {
	ti := newTestImage(t)
	img, err := newFakeRegistry(t, ti).registry().Resolve(context.Background(), "1.2.0", Platform{OS: "linux", Architecture: "arm64"})
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != digestOf(ti.otherManifest) {
		t.Fatalf("got %s", img.Digest)
	}
	_, err = newFakeRegistry(t, ti).registry().Resolve(context.Background(), "1.2.0", Platform{OS: "linux", Architecture: "riscv64"})
	wantErr(t, err, `no manifest for linux/riscv64 (it has: "linux/arm64", "linux/amd64")`)
}

func TestRegistryResolveByDigest(t *testing.T) {
	ti := newTestImage(t)
	reg := newFakeRegistry(t, ti).registry()
	for _, ref := range []string{digestOf(ti.index), digestOf(ti.manifest), "1.2.0@" + digestOf(ti.index)} {
		img, err := reg.Resolve(context.Background(), ref, amd64)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if img.Digest != digestOf(ti.manifest) {
			t.Fatalf("%s: got %s", ref, img.Digest)
		}
	}
}

func TestRegistryManifestNotMatchingReferenceDigest(t *testing.T) {
	ti := newTestImage(t)
	f := newFakeRegistry(t, ti)
	f.manifests["sha256:"+hexA] = ti.manifest
	_, err := f.registry().Resolve(context.Background(), "sha256:"+hexA, amd64)
	wantErr(t, err, "hashes to "+digestOf(ti.manifest))
}

func TestRegistryIndexEntryNotMatching(t *testing.T) {
	ti := newTestImage(t)
	f := newFakeRegistry(t, ti)
	tampered := bytes.Replace(ti.manifest, []byte(`"beta"`), []byte(`"alfa"`), 1)
	f.manifests[digestOf(ti.manifest)] = tampered
	_, err := f.registry().Resolve(context.Background(), "1.2.0", amd64)
	wantErr(t, err, "manifest "+digestOf(ti.manifest)+" hashes to "+digestOf(tampered))
}

// A layer whose bytes are not what its digest says: the tar itself is fine (same length, one
// letter changed), so only the verifying reader can tell, at the end of the stream.
func TestRegistryCorruptBlob(t *testing.T) {
	good := tarOf(t, file("etc/motd", "hello"))
	bad := bytes.Replace(good, []byte("hello"), []byte("HELLO"), 1)
	d := descOf(MediaTypeLayer, good)
	// The gzip variant differs only in its header's OS byte: it decompresses to the same tar.
	goodGz := gzipped(t, good)
	badGz := append([]byte(nil), goodGz...)
	badGz[9] ^= 0x01
	dGz := descOf(MediaTypeLayerGzip, goodGz)
	for _, tc := range []struct {
		d       Descriptor
		bad     []byte
		chunked bool
	}{{d, bad, false}, {d, bad, true}, {dGz, badGz, false}, {dGz, badGz, true}} {
		d, bad, chunked := tc.d, tc.bad, tc.chunked
		f := newFakeRegistry(t, nil)
		f.chunked = chunked
		f.blobs[d.Digest] = bad
		reg := f.registry()

		rc, err := reg.Blob(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(io.Discard, rc)
		rc.Close()
		wantErr(t, err, d.Digest)

		rc, err = reg.Blob(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Unpack(scratch(t), rc, d.MediaType, Limits{MaxBytes: 1 << 20, MaxEntries: 10})
		rc.Close()
		wantErr(t, err, "digest mismatch")
		wantErr(t, err, d.Digest)
	}
}

func TestRegistryBlobLongerThanDescriptor(t *testing.T) {
	d := descOf(MediaTypeLayer, []byte("abc"))
	f := newFakeRegistry(t, nil)
	f.blobs[d.Digest] = []byte("abcdef")
	_, err := f.registry().Blob(context.Background(), d)
	wantErr(t, err, "the registry sends 6 bytes, its descriptor says 3")

	f.chunked = true // no Content-Length: the verifier must stop it
	rc, err := f.registry().Blob(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	_, err = io.Copy(io.Discard, rc)
	wantErr(t, err, "more than the 3 bytes")
}

func TestRegistryBlobRedirectDropsAuthorization(t *testing.T) {
	ti := newTestImage(t)
	f := newFakeRegistry(t, ti)
	f.redirect = true
	f.token = "t0k3n"
	unpackFrom(t, f)
	if len(f.storageAuth) != 3 { // config and two layers
		t.Fatalf("storage got %d requests", len(f.storageAuth))
	}
	for _, a := range f.storageAuth {
		if a != "" {
			t.Fatalf("the token leaked to the storage server: %q", a)
		}
	}
}

func TestRegistryOversizeManifest(t *testing.T) {
	big := append([]byte(`{"schemaVersion":2,"x":"`), bytes.Repeat([]byte("a"), maxManifestBytes)...)
	big = append(big, `"}`...)
	for _, chunked := range []bool{false, true} {
		f := newFakeRegistry(t, nil)
		f.chunked = chunked
		f.manifests["big"] = big
		_, err := f.registry().Resolve(context.Background(), "big", amd64)
		wantErr(t, err, "4194304")
	}
}

// Resolve refuses what is not an image it can install: other schemas and media types, what is
// not JSON, oversized or malformed descriptors, nested indexes, unknown or malformed references.
func TestRegistryRefusesBadDocuments(t *testing.T) {
	ti := newTestImage(t)
	f := newFakeRegistry(t, ti)
	f.manifests["old"] = []byte(`{"schemaVersion":1,"name":"kiln/installer","tag":"old","fsLayers":[]}`)
	f.types["old"] = "application/vnd.docker.distribution.manifest.v1+prettyjws"
	f.manifests["art"] = []byte(`{"schemaVersion":2,"mediaType":"application/vnd.example.thing+json","config":{}}`)
	f.manifests["neither"] = []byte(`{"schemaVersion":2}`)
	f.manifests["notjson"] = []byte(`<html>`)
	var m Manifest
	json.Unmarshal(ti.manifest, &m)
	m.Config.Size = maxConfigBytes + 1
	f.manifests["bigconfig"] = mustJSON(t, m)
	json.Unmarshal(ti.manifest, &m)
	m.Layers[0].Digest = "sha256:../../../etc"
	f.manifests["baddigest"] = mustJSON(t, m)
	json.Unmarshal(ti.manifest, &m)
	m.Layers[1].MediaType = ""
	f.manifests["notype"] = mustJSON(t, m)
	// An index whose amd64 entry is itself an index: only image manifests are followed.
	f.manifests["nested"] = mustJSON(t, Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{
		{MediaType: MediaTypeIndex, Digest: digestOf(ti.index), Size: int64(len(ti.index)), Platform: &amd64},
	}})
	reg := f.registry()
	for ref, why := range map[string]string{
		"old":       "schema1",
		"art":       "unsupported manifest media type",
		"neither":   "neither an image index nor an image manifest",
		"notjson":   "not a JSON object",
		"bigconfig": "more than the 1048576 allowed",
		"baddigest": `layer 0: descriptor digest "sha256:../../../etc"`,
		"notype":    "layer 1: descriptor sha256:",
		"nested":    "no manifest for linux/amd64",
		"no-such":   "404 Not Found: MANIFEST_UNKNOWN fake registry says no?",
		"BAD/TAG":   "is not [A-Za-z0-9_]",
		"sha512:00": "neither a tag nor a sha256 digest",
	} {
		_, err := reg.Resolve(context.Background(), ref, amd64)
		wantErr(t, err, why)
	}
}

func TestRegistryBearerTokenDance(t *testing.T) {
	ti := newTestImage(t)
	f := newFakeRegistry(t, ti)
	f.token = "t0k3n"
	reg := unpackFrom(t, f)
	if len(f.tokenQueries) != 1 {
		t.Fatalf("fetched %d tokens, want 1 (it is kept)", len(f.tokenQueries))
	}
	q := f.tokenQueries[0]
	if q.Get("service") != "fake" || q.Get("scope") != "repository:kiln/installer:pull" {
		t.Fatalf("token query %v", q)
	}
	// A token the registry stops accepting is replaced once.
	f.token = "n3w"
	if _, err := reg.Tags(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(f.tokenQueries) != 2 {
		t.Fatalf("fetched %d tokens", len(f.tokenQueries))
	}
}

func TestRegistryTokenRefusals(t *testing.T) {
	f := newFakeRegistry(t, newTestImage(t))
	f.token = "t0k3n"
	for realm, why := range map[string]string{
		"file:///etc/passwd":        "scheme must be http or https",
		"http:///token":             "has no host",
		"http://127.0.0.1:1/token":  "token from http://127.0.0.1:1/token",
		f.srv.URL + "/v2/nothing/x": "token: GET",
	} {
		f.realm = realm
		_, err := f.registry().Resolve(context.Background(), "1.2.0", amd64)
		wantErr(t, err, why)
	}
	f.realm = ""
	f.token = "two words"
	_, err := f.registry().Resolve(context.Background(), "1.2.0", amd64)
	wantErr(t, err, "spaces or control characters")

	f.token = ""
	f.basicOnly = true
	_, err = f.registry().Resolve(context.Background(), "1.2.0", amd64)
	wantErr(t, err, "without a Bearer challenge")
}

func TestAuthParams(t *testing.T) {
	got := authParams(` realm="https://auth.example/token" , service=registry.example,scope="repository:a/b:pull,push",x="q\"uote"`)
	want := map[string]string{"realm": "https://auth.example/token", "service": "registry.example", "scope": "repository:a/b:pull,push", "x": `q"uote`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v", got)
	}
	for _, s := range []string{"", "=", `a="unterminated`, ",,,", "a=b,c", `realm=`} {
		authParams(s) // must not panic
	}
}

func TestRegistryTagsPagination(t *testing.T) {
	f := newFakeRegistry(t, nil)
	f.tags = []string{"1.0.0", "1.1.0", "1.2.0-rc.1", "1.2.0", "latest"}
	f.pageSize = 2
	f.token = "t0k3n" // pages are fetched with the token too
	tags, err := f.registry().Tags(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(tags, " ") != strings.Join(f.tags, " ") {
		t.Fatalf("got %v", tags)
	}
}

func TestRegistryTagsRefusals(t *testing.T) {
	f := newFakeRegistry(t, nil)
	f.tags = []string{"a", "b", "c"}
	f.pageSize = 1
	f.nextHost = "evil.example"
	_, err := f.registry().Tags(context.Background())
	wantErr(t, err, "leaves the registry")

	f = newFakeRegistry(t, nil)
	for i := 0; i <= maxTags; i++ {
		f.tags = append(f.tags, strconv.Itoa(i))
	}
	_, err = f.registry().Tags(context.Background())
	wantErr(t, err, "more than 10000")

	f = newFakeRegistry(t, nil)
	f.tags = []string{"ok", "../bad"}
	_, err = f.registry().Tags(context.Background())
	wantErr(t, err, `malformed tag "../bad"`)

	f = newFakeRegistry(t, nil)
	f.repo = "other"
	reg := f.registry()
	reg.Repo = "kiln/installer"
	_, err = reg.Tags(context.Background())
	wantErr(t, err, "404 Not Found: NAME_UNKNOWN")
}

func TestRegistryConfigChecked(t *testing.T) {
	_, err := (&Registry{Host: "reg.example", Repo: "UPPER"}).Tags(context.Background())
	wantErr(t, err, "repository")
	_, err = (&Registry{Host: "evil.example/x?", Repo: "a"}).Tags(context.Background())
	wantErr(t, err, "not a DNS name")
	_, err = (&Registry{Host: "reg.example", Repo: "a"}).Blob(context.Background(), Descriptor{Digest: "sha256:x"})
	wantErr(t, err, "not sha256")
}

// quietTLSServer is an httptest TLS server that does not log the handshakes tests make fail.
func quietTLSServer(h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	return srv
}

func TestRegistryTLS(t *testing.T) {
	ti := newTestImage(t)
	f := newFakeRegistry(t, ti)
	srv := quietTLSServer(http.HandlerFunc(f.serve))
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	host := strings.TrimPrefix(srv.URL, "https://")

	img, err := (&Registry{Host: host, Repo: f.repo, RootCAs: pool}).Resolve(context.Background(), "1.2.0", amd64)
	if err != nil || img.Digest != digestOf(ti.manifest) {
		t.Fatalf("%v %s", err, img.Digest)
	}
	_, err = (&Registry{Host: host, Repo: f.repo}).Resolve(context.Background(), "1.2.0", amd64)
	wantErr(t, err, "certificate")

	// An https registry may not send its token realm (or anything else) over plain http.
	f.token = "t0k3n"
	f.realm = f.srv.URL + "/token"
	_, err = (&Registry{Host: host, Repo: f.repo, RootCAs: pool}).Resolve(context.Background(), "1.2.0", amd64)
	wantErr(t, err, "refusing plain http URL")
}

func TestRegistryConfigVerified(t *testing.T) {
	ti := newTestImage(t)
	cfg := descOf(MediaTypeConfig, ti.config)
	f := newFakeRegistry(t, ti)
	f.blobs[cfg.Digest] = bytes.ToUpper(ti.config) // same size, other bytes
	_, err := f.registry().Resolve(context.Background(), "1.2.0", amd64)
	wantErr(t, err, "config: blob "+cfg.Digest+": digest mismatch")

	// A config that is verified but not JSON.
	junk := []byte("not json")
	var m Manifest
	json.Unmarshal(ti.manifest, &m)
	m.Config = descOf(MediaTypeConfig, junk)
	f.blobs[m.Config.Digest] = junk
	f.manifests["junkconfig"] = mustJSON(t, m)
	_, err = f.registry().Resolve(context.Background(), "junkconfig", amd64)
	wantErr(t, err, "is not an image config")
}
