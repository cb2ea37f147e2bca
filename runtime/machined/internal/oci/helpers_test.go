package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// entry is one member of a tar built by a test.
type entry struct {
	name string
	body string
	typ  byte // 0 means a regular file
	link string
	mode int64
	size int64 // when non-zero, the header's size regardless of body (for hostile headers)
}

func file(name, body string) entry           { return entry{name: name, body: body} }
func dir(name string) entry                  { return entry{name: name, typ: tar.TypeDir} }
func symlink(name, target string) entry      { return entry{name: name, typ: tar.TypeSymlink, link: target} }
func hardlink(name, target string) entry     { return entry{name: name, typ: tar.TypeLink, link: target} }
func whiteoutOf(name string) entry           { return file(name, "") }
func withMode(e entry, mode int64) entry     { e.mode = mode; return e }
func ofType(name string, typ byte) entry     { return entry{name: name, typ: typ} }
func tarOf(t testing.TB, es ...entry) []byte { return makeTar(t, es...) }

func makeTar(t testing.TB, es ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func mustJSON(t testing.TB, v interface{}) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func descOf(mediaType string, b []byte) Descriptor {
	return Descriptor{MediaType: mediaType, Digest: digestOf(b), Size: int64(len(b))}
}

// testImage is an installer-like image: an index for two platforms, a manifest with release
// annotations, a config and two gzip layers with roles.
type testImage struct {
	index, manifest, config []byte
	layers                  [][]byte
	otherManifest           []byte // the arm64 manifest
	blobs                   map[string][]byte
}

func newTestImage(t testing.TB) *testImage {
	t.Helper()
	img := &testImage{blobs: map[string][]byte{}}
	img.config = mustJSON(t, map[string]interface{}{
		"architecture": "amd64", "os": "linux",
		"config": map[string]interface{}{
			"Labels":     map[string]string{AnnotationVersion: "1.2.0"},
			"Entrypoint": []string{"/usr/bin/installer"},
		},
	})
	img.layers = [][]byte{
		gzipped(t, tarOf(t, dir("usr/"), dir("usr/bin/"), withMode(file("usr/bin/installer", "#!installer\n"), 0o755))),
		gzipped(t, tarOf(t, dir("boot/"), file("boot/vmlinuz", "kernel"))),
	}
	var layers []Descriptor
	for i, l := range img.layers {
		d := descOf(MediaTypeLayerGzip, l)
		d.Annotations = map[string]string{AnnotationLayer: []string{"installer", "boot"}[i]}
		layers = append(layers, d)
		img.blobs[d.Digest] = l
	}
	cfg := descOf(MediaTypeConfig, img.config)
	img.blobs[cfg.Digest] = img.config
	img.manifest = mustJSON(t, Manifest{
		SchemaVersion: 2, MediaType: MediaTypeManifest, Config: cfg, Layers: layers,
		Annotations: map[string]string{AnnotationVersion: "1.2.0", AnnotationChannel: "beta", AnnotationArch: "amd64"},
	})
	img.otherManifest = mustJSON(t, Manifest{
		SchemaVersion: 2, MediaType: MediaTypeManifest, Config: cfg,
		Annotations: map[string]string{AnnotationArch: "arm64"},
	})
	arm := descOf(MediaTypeManifest, img.otherManifest)
	arm.Platform = &Platform{OS: "linux", Architecture: "arm64"}
	amd := descOf(MediaTypeManifest, img.manifest)
	amd.Platform = &Platform{OS: "linux", Architecture: "amd64"}
	img.index = mustJSON(t, Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{arm, amd}})
	return img
}

var amd64 = Platform{OS: "linux", Architecture: "amd64"}

// tree lists every path under dir (relative, slash-separated, directories with a trailing /)
// with symlink targets, so a test can compare what an unpack left.
func tree(t testing.TB, root string) string {
	t.Helper()
	var out []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		switch {
		case fi.IsDir():
			rel += "/"
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			rel += " -> " + target
		}
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, "\n")
}

// scratch is a t.TempDir that can be removed even after an unpack left directories without
// write or search permission (a non-root test run could not clean it up otherwise).
func scratch(t testing.TB) string {
	d := t.TempDir()
	t.Cleanup(func() {
		filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	return d
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wantErr(t testing.TB, err error, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", substr)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Fatalf("error %q does not contain %q", err, substr)
	}
}
