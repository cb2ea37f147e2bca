package oci

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// rangeServer serves a tarball as a static file server does (http.ServeContent: byte ranges),
// and counts the bytes it sent and the ranges asked for.
type rangeServer struct {
	mu     sync.Mutex
	tar    []byte
	sent   int64
	ranges []string
	plain  bool // ignore Range, as a minimal server does
}

func (s *rangeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.ranges = append(s.ranges, r.Header.Get("Range"))
	s.mu.Unlock()
	if s.plain {
		r.Header.Del("Range")
	}
	cw := &countingWriter{ResponseWriter: w, s: s}
	http.ServeContent(cw, r, "installer.tar", time.Time{}, bytes.NewReader(s.tar))
}

type countingWriter struct {
	http.ResponseWriter
	s *rangeServer
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.s.mu.Lock()
	c.s.sent += int64(len(p))
	c.s.mu.Unlock()
	return c.ResponseWriter.Write(p)
}

func (s *rangeServer) sentBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

// signedLayoutWithABigLayer is a layout whose image is signed and has a 4 MiB layer that does
// not compress.
func signedLayoutWithABigLayer(t *testing.T) (tarball []byte, digest string, big Descriptor, pub ed25519.PublicKey) {
	noise := make([]byte, 4<<20)
	rand.Read(noise)
	layer := tarOf(t, file("usr/share/noise", string(noise)))
	big = descOf(MediaTypeLayer, layer)
	config := mustJSON(t, map[string]interface{}{"architecture": "amd64", "os": "linux"})
	manifest := mustJSON(t, Manifest{SchemaVersion: 2, MediaType: MediaTypeManifest, Config: descOf(MediaTypeConfig, config), Layers: []Descriptor{big}})
	digest = digestOf(manifest)
	pub, priv := testKey(1)
	s := newSignature(t, digest, priv, nil)
	sigDesc := descOf(MediaTypeManifest, s.raw)
	sigDesc.Annotations = map[string]string{AnnotationRefName: SignatureTag(digest)}
	amd := descOf(MediaTypeManifest, manifest)
	amd.Platform = &amd64
	es := []entry{
		file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`),
		file("index.json", string(mustJSON(t, Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{amd, sigDesc}}))),
	}
	// the big layer first: a tarball's order says nothing about what is read first
	for _, b := range [][]byte{layer, manifest, config, s.raw, s.payload} {
		es = append(es, file("blobs/sha256/"+strings.TrimPrefix(digestOf(b), "sha256:"), string(b)))
	}
	return makeTar(t, es...), digest, big, pub
}

func TestARemoteLayoutIsCheckedBeforeItsLayersAreFetched(t *testing.T) {
	tarball, digest, big, pub := signedLayoutWithABigLayer(t)
	srv := &rangeServer{tar: tarball}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	ctx := context.Background()

	l, err := OpenRemoteLayout(ctx, hs.URL+"/installer.tar", 8<<20, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	img, err := l.Resolve(ctx, "", amd64)
	if err != nil || img.Digest != digest {
		t.Fatalf("%v %s", err, img.Digest)
	}
	if _, err := VerifySignature(ctx, l, digest, []crypto.PublicKey{pub}); err != nil {
		t.Fatal(err)
	}
	// the index, the manifest, the config and the signature: a few blocks, not the layer
	if n := srv.sentBytes(); n > 256<<10 {
		t.Fatalf("%d bytes fetched before the layers, of a %d-byte tarball", n, len(tarball))
	}
	rc, err := l.Blob(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	root := t.TempDir()
	if _, err := Unpack(root, rc, big.MediaType, Limits{MaxBytes: 8 << 20, MaxEntries: 10}); err != nil {
		t.Fatal(err)
	}
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	if n := srv.sentBytes(); n < 4<<20 || n > int64(len(tarball))+(256<<10) {
		t.Fatalf("%d bytes fetched in all", n)
	}
}

func TestRemoteLayoutRefusals(t *testing.T) {
	tarball, _, big, _ := signedLayoutWithABigLayer(t)
	ctx := context.Background()

	// a server that ignores Range would send the whole tarball: refused at the first answer
	plain := httptest.NewServer(&rangeServer{tar: tarball, plain: true})
	defer plain.Close()
	_, err := OpenRemoteLayout(ctx, plain.URL+"/installer.tar", 8<<20, true, nil)
	if err == nil || !strings.Contains(err.Error(), ErrNoRanges.Error()) {
		t.Fatalf("no ranges: %v", err)
	}

	hs := httptest.NewServer(&rangeServer{tar: tarball})
	defer hs.Close()
	// larger than allowed
	_, err = OpenRemoteLayout(ctx, hs.URL+"/installer.tar", 1<<20, true, nil)
	wantErr(t, err, "more than the 1048576 allowed")
	// plain http needs insecure
	_, err = OpenRemoteLayout(ctx, hs.URL+"/installer.tar", 8<<20, false, nil)
	wantErr(t, err, "refusing plain http URL")

	// a layer that is not the bytes its descriptor names fails as it streams
	l, err := OpenRemoteLayout(ctx, hs.URL+"/installer.tar", 8<<20, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	wrong := big
	wrong.Digest = "sha256:" + strings.Repeat("0", 64)
	if _, err := l.Blob(ctx, wrong); err == nil {
		t.Fatal("a blob the layout does not hold")
	}

	// a server whose file changes size between answers
	var calls int
	changing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		body := tarball
		if calls > 1 {
			body = append(append([]byte(nil), tarball...), make([]byte, 1024)...)
		}
		http.ServeContent(w, r, "x.tar", time.Time{}, bytes.NewReader(body))
	}))
	defer changing.Close()
	if _, err := OpenRemoteLayout(ctx, changing.URL+"/x.tar", 8<<20, true, nil); err == nil || !strings.Contains(err.Error(), "bytes now") {
		t.Fatalf("a changing file: %v", err)
	}

	// a budget smaller than the tarball: what is fetched stops at it
	l, err = OpenRemoteLayout(ctx, hs.URL+"/installer.tar", int64(len(tarball)), true, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		rc, err := l.Blob(ctx, big)
		if err != nil {
			wantErr(t, err, "bytes allowed would be fetched")
			return
		}
		io.Copy(io.Discard, rc)
		rc.Close()
	}
	t.Fatal("three layer fetches within a budget of one tarball")
}

func TestParseContentRange(t *testing.T) {
	for v, want := range map[string][3]int64{
		"bytes 0-511/1024":  {0, 511, 1024},
		"bytes 512-512/513": {512, 512, 513},
		"bytes 0-0/1":       {0, 0, 1},
	} {
		a, b, c, err := ParseContentRange(v)
		if err != nil || [3]int64{a, b, c} != want {
			t.Errorf("%q: %d %d %d %v", v, a, b, c, err)
		}
	}
	for _, v := range []string{"", "bytes */1024", "bytes 0-511/*", "bytes 5-4/10", "bytes 0-10/10", "bytes -1-5/10",
		"bytes 0-5/+10", "items 0-5/10", "bytes 0-5/10 ", "bytes 0-99999999999999999999/1", "bytes 0x1-5/10"} {
		if _, _, _, err := ParseContentRange(v); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
}
