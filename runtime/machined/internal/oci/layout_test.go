package oci

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// layoutEntries lays out ti as `kiln image` does: oci-layout, index.json (one entry per
// platform, named by ref.name), blobs/sha256/<hex> and Docker's manifest.json.
func layoutEntries(t *testing.T, ti *testImage) []entry {
	blobs := map[string][]byte{digestOf(ti.manifest): ti.manifest, digestOf(ti.otherManifest): ti.otherManifest}
	for d, b := range ti.blobs {
		blobs[d] = b
	}
	amd := descOf(MediaTypeManifest, ti.manifest)
	amd.Platform = &amd64
	amd.Annotations = map[string]string{AnnotationRefName: "1.2.0"}
	arm := descOf(MediaTypeManifest, ti.otherManifest)
	arm.Platform = &Platform{OS: "linux", Architecture: "arm64"}
	arm.Annotations = map[string]string{AnnotationRefName: "1.2.0-arm64"}
	es := []entry{
		dir("blobs/"), dir("blobs/sha256/"),
		file("index.json", string(mustJSON(t, Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{amd, arm}}))),
		file("manifest.json", `[{"Config":"blobs/sha256/x","RepoTags":["kiln/installer:1.2.0"],"Layers":[]}]`),
		file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`),
	}
	// A name too long for a ustar header: it takes a PAX extended header, so the members
	// after it start further on than a naive 512-byte stride would say.
	es = append(es, file("aux/"+strings.Repeat("long-name.", 20), "ignored"))
	var names []string
	for d := range blobs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		es = append(es, file("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), string(blobs[d])))
	}
	return es
}

func writeLayout(t *testing.T, es ...entry) string {
	p := filepath.Join(t.TempDir(), "installer.tar")
	if err := os.WriteFile(p, makeTar(t, es...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func openLayout(t *testing.T, es ...entry) *Layout {
	l, err := OpenLayoutTar(writeLayout(t, es...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestLayoutResolveAndUnpack(t *testing.T) {
	ti := newTestImage(t)
	l := openLayout(t, layoutEntries(t, ti)...)
	if len(l.Index()) != 2 {
		t.Fatalf("index %+v", l.Index())
	}
	for _, ref := range []string{"", "1.2.0", digestOf(ti.manifest)} {
		img, err := l.Resolve(context.Background(), ref, amd64)
		if err != nil {
			t.Fatalf("%q: %v", ref, err)
		}
		if img.Digest != digestOf(ti.manifest) || ReleaseOf(ref, img).Channel != "beta" {
			t.Fatalf("%q: got %s", ref, img.Digest)
		}
	}
	img, _ := l.Resolve(context.Background(), "", amd64)
	root, err := unpackImage(t, l, img)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, "usr/bin/installer")); got != "#!installer\n" {
		t.Fatalf("installer %q", got)
	}
	img, err = l.Resolve(context.Background(), "", Platform{OS: "linux", Architecture: "arm64"})
	if err != nil || img.Digest != digestOf(ti.otherManifest) {
		t.Fatalf("arm64: %v %s", err, img.Digest)
	}
	_, err = l.Resolve(context.Background(), "", Platform{OS: "linux", Architecture: "s390x"})
	wantErr(t, err, "no image for this platform")
	_, err = l.Resolve(context.Background(), "9.9.9", amd64)
	wantErr(t, err, `no image "9.9.9" (it has: "1.2.0", "1.2.0-arm64")`)
	_, err = l.Resolve(context.Background(), "sha256:"+hexA, amd64)
	wantErr(t, err, "no image")
}

// A layout whose index.json names an image index (multi-platform), as other tools write it.
func TestLayoutThroughNestedIndex(t *testing.T) {
	ti := newTestImage(t)
	es := layoutEntries(t, ti)
	top := descOf(MediaTypeIndex, ti.index)
	es[2] = file("index.json", string(mustJSON(t, Index{SchemaVersion: 2, Manifests: []Descriptor{top}})))
	es = append(es, file("blobs/sha256/"+strings.TrimPrefix(top.Digest, "sha256:"), string(ti.index)))
	l := openLayout(t, es...)
	for _, ref := range []string{"", top.Digest, digestOf(ti.manifest)} {
		img, err := l.Resolve(context.Background(), ref, amd64)
		if err != nil || img.Digest != digestOf(ti.manifest) {
			t.Fatalf("%q: %v %s", ref, err, img.Digest)
		}
	}
}

func TestLayoutBlobVerified(t *testing.T) {
	ti := newTestImage(t)
	es := layoutEntries(t, ti)
	layer := descOf(MediaTypeLayerGzip, ti.layers[0])
	for i, e := range es {
		if e.name == "blobs/sha256/"+strings.TrimPrefix(layer.Digest, "sha256:") {
			b := []byte(e.body)
			b[len(b)-1] ^= 0xff // the gzip trailer's last byte: same size, wrong bytes
			es[i].body = string(b)
		}
	}
	l := openLayout(t, es...)
	rc, err := l.Blob(context.Background(), layer)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, rc)
	rc.Close()
	wantErr(t, err, "blob "+layer.Digest+": digest mismatch")

	short := layer
	short.Size--
	_, err = l.Blob(context.Background(), short)
	wantErr(t, err, "its descriptor says")
	_, err = l.Blob(context.Background(), Descriptor{Digest: "sha256:" + hexA, Size: 1})
	wantErr(t, err, "not in the layout")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = l.Blob(ctx, layer)
	wantErr(t, err, "canceled")
}

func TestLayoutRefusals(t *testing.T) {
	ti := newTestImage(t)
	base := layoutEntries(t, ti)
	with := func(extra ...entry) []entry { return append(append([]entry(nil), base...), extra...) }
	replace := func(name string, e entry) []entry {
		out := append([]entry(nil), base...)
		for i := range out {
			if out[i].name == name {
				out[i] = e
			}
		}
		return out
	}
	for why, es := range map[string][]entry{
		`member name "../evil" escapes`:             with(file("../evil", "x")),
		`member name "blobs/../../evil" escapes`:    with(file("blobs/../../evil", "x")),
		`member name "/etc/passwd" is absolute`:     with(file("/etc/passwd", "x")),
		`member name "./../x/" escapes`:             with(dir("./../x/")),
		`member name "blobs//sha256" is not clean`:  with(file("blobs//sha256", "x")),
		`member "index.json" appears twice`:         with(file("./index.json", "{}")),
		`type '2' is not allowed`:                   with(symlink("blobs/sha256/link", "/etc/shadow")),
		`type '1' is not allowed`:                   with(hardlink("blobs/sha256/link", "oci-layout")),
		`type '3' is not allowed`:                   with(ofType("dev", tar.TypeChar)),
		"no oci-layout":                             replace("oci-layout", file("not-oci-layout", "")),
		`oci-layout is not`:                         replace("oci-layout", file("oci-layout", `{"imageLayoutVersion":"2.0.0"}`)),
		"no index.json":                             replace("index.json", file("index.jso", "")),
		"index.json: schemaVersion is 0":            replace("index.json", file("index.json", `{"manifests":[]}`)),
		"index.json: unexpected end":                replace("index.json", file("index.json", `{`)),
		`index.json: manifest 0: descriptor digest`: replace("index.json", file("index.json", `{"schemaVersion":2,"manifests":[{"mediaType":"x","digest":"sha256:ABC","size":1}]}`)),
		`index.json: manifest 0: descriptor`:        replace("index.json", file("index.json", `{"schemaVersion":2,"manifests":[{"mediaType":"x","digest":"sha256:`+hexA+`","size":-1}]}`)),
		"index.json is 4194305 bytes":               replace("index.json", file("index.json", strings.Repeat(" ", maxManifestBytes+1))),
	} {
		_, err := OpenLayoutTar(writeLayout(t, es...))
		wantErr(t, err, why)
	}
	_, err := OpenLayoutTar(filepath.Join(t.TempDir(), "missing.tar"))
	wantErr(t, err, "no such file")
}

func TestLayoutTruncatedOrNotTar(t *testing.T) {
	p := writeLayout(t, layoutEntries(t, newTestImage(t))...)
	b, _ := os.ReadFile(p)
	for name, data := range map[string][]byte{"truncated": b[:len(b)/2+100], "garbage": []byte(strings.Repeat("not a tar ", 100))} {
		q := filepath.Join(t.TempDir(), name)
		os.WriteFile(q, data, 0o644)
		if l, err := OpenLayoutTar(q); err == nil {
			l.Close()
			t.Errorf("%s: opened", name)
		}
	}
}

func TestLayoutAmbiguous(t *testing.T) {
	ti := newTestImage(t)
	es := layoutEntries(t, ti)
	d := descOf(MediaTypeManifest, ti.manifest)
	d.Platform = &amd64
	es[2] = file("index.json", string(mustJSON(t, Index{SchemaVersion: 2, Manifests: []Descriptor{d, d}})))
	l := openLayout(t, es...)
	_, err := l.Resolve(context.Background(), "", amd64)
	wantErr(t, err, "has 2 images for linux/amd64")
}
