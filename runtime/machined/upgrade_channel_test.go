package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"kiln/machined/internal/oci"
)

// releaseManifest is a release's image manifest (and its config blob) for this architecture.
func releaseManifest(t *testing.T, version, channel string) (manifest, config []byte) {
	config = []byte(`{"architecture":"` + runtime.GOARCH + `","os":"linux"}`)
	manifest, err := json.Marshal(map[string]interface{}{
		"schemaVersion": 2,
		"mediaType":     oci.MediaTypeManifest,
		"config":        map[string]interface{}{"mediaType": oci.MediaTypeConfig, "digest": sha256Digest(config), "size": len(config)},
		"layers":        []interface{}{},
		"annotations": map[string]string{
			oci.AnnotationVersion: version, oci.AnnotationChannel: channel, oci.AnnotationArch: runtime.GOARCH,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return manifest, config
}

// swappingRegistry serves a repository whose tag 2.0.0 names a stable release when it is first
// read and an alpha one after: a registry that moves the tag between choice and pull.
type swappingRegistry struct {
	mu       sync.Mutex
	files    map[string][]byte
	tagReads int
	swapped  []byte
}

func (s *swappingRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := strings.TrimPrefix(r.URL.Path, "/v2/kiln/installer/")
	if p == "tags/list" {
		w.Write([]byte(`{"name":"kiln/installer","tags":["1.0.0","2.0.0"]}`))
		return
	}
	b, ok := s.files[p]
	if p == "manifests/2.0.0" {
		s.tagReads++
		if s.tagReads > 1 {
			b = s.swapped
		}
	}
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"errors":[{"code":"MANIFEST_UNKNOWN","message":"not here"}]}`))
		return
	}
	if strings.HasPrefix(p, "manifests/") {
		w.Header().Set("Content-Type", oci.MediaTypeManifest)
	}
	w.Write(b)
}

func TestAChannelChoiceIsOneDigestAndItsChannelIsCheckedAgain(t *testing.T) {
	stable, stableCfg := releaseManifest(t, "2.0.0", "stable")
	alpha, alphaCfg := releaseManifest(t, "2.0.0", "alpha")
	old, oldCfg := releaseManifest(t, "1.0.0", "stable")
	reg := &swappingRegistry{files: map[string][]byte{
		"manifests/1.0.0":                   old,
		"manifests/2.0.0":                   stable,
		"manifests/" + sha256Digest(stable): stable,
		"manifests/" + sha256Digest(alpha):  alpha,
		"blobs/" + sha256Digest(stableCfg):  stableCfg,
		"blobs/" + sha256Digest(alphaCfg):   alphaCfg,
		"blobs/" + sha256Digest(oldCfg):     oldCfg,
	}, swapped: alpha}
	srv := httptest.NewServer(reg)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	m := &machine{con: quietConsole(), version: "1.0.0", cfg: &Config{Registries: []RegistryConfig{{Host: host, Insecure: true}}}}
	req := upgradeRequest{Channel: "stable", Repository: host + "/kiln/installer"}
	ctx := context.Background()

	src, ref, err := m.upgradeSource(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if ref != sha256Digest(stable) {
		t.Fatalf("the choice is %q, want the stable manifest's digest", ref)
	}
	// the tag now names the alpha release; the pull goes by digest and gets the stable one
	img, err := src.Resolve(ctx, ref, oci.Platform{OS: "linux", Architecture: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	if reg.tagReads != 1 || img.Digest != ref {
		t.Fatalf("tag read %d times, pulled %s", reg.tagReads, img.Digest)
	}
	if err := checkChannel(req, oci.ReleaseOf(ref, img)); err != nil {
		t.Fatal(err)
	}

	// a manifest whose own channel the machine's channel does not take is refused
	err = checkChannel(req, oci.Release{Version: "2.0.0", Channel: "alpha"})
	if err == nil || !strings.Contains(err.Error(), `channel "alpha"`) {
		t.Fatalf("alpha on stable: %v", err)
	}
	if err := checkChannel(upgradeRequest{Image: "h/r:2.0.0"}, oci.Release{Channel: "alpha"}); err != nil {
		t.Fatalf("an image reference has no channel to check: %v", err)
	}
}
