package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"kiln/machined/internal/oci"
)

// tarLayer is a gzip layer holding files (name: content).
func tarLayer(t *testing.T, files map[string][]byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, b := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// imageOf serves layers as one image under tag 2.0.0 (files for signatureRegistry).
func imageOf(t *testing.T, layers ...[]byte) map[string][]byte {
	config := []byte(`{"architecture":"` + runtime.GOARCH + `","os":"linux"}`)
	files := map[string][]byte{"blobs/" + sha256Digest(config): config}
	var descs []interface{}
	for _, l := range layers {
		files["blobs/"+sha256Digest(l)] = l
		descs = append(descs, map[string]interface{}{"mediaType": oci.MediaTypeLayerGzip, "digest": sha256Digest(l), "size": len(l)})
	}
	manifest, err := json.Marshal(map[string]interface{}{
		"schemaVersion": 2, "mediaType": oci.MediaTypeManifest,
		"config": map[string]interface{}{"mediaType": oci.MediaTypeConfig, "digest": sha256Digest(config), "size": len(config)},
		"layers": descs, "annotations": map[string]string{oci.AnnotationVersion: "2.0.0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	files["manifests/2.0.0"] = manifest
	return files
}

func TestOneUnpackBudgetForAllTheLayers(t *testing.T) {
	defer func(b int64) { upgradeBudget = b }(upgradeBudget)
	upgradeBudget = 1 << 20
	big := bytes.Repeat([]byte{'x'}, 600<<10)
	ctx := context.Background()
	for name, tc := range map[string]struct {
		layers [][]byte
		want   string
	}{
		// each layer is under the budget; together they are not
		"two layers": {[][]byte{tarLayer(t, map[string][]byte{"a": big}), tarLayer(t, map[string][]byte{"b": big})}, "would pass the limit"},
		// what the descriptors say is over the budget before a byte is fetched
		"declared": {[][]byte{bytes.Repeat([]byte{0}, 1<<20+1)}, "more than the 1048576 an upgrade may pull"},
	} {
		reg := signatureRegistry(t, imageOf(t, tc.layers...))
		img, err := reg.Resolve(ctx, "2.0.0", oci.Platform{OS: "linux", Architecture: runtime.GOARCH})
		if err != nil {
			t.Fatal(err)
		}
		m := &machine{con: quietConsole(), upgrades: upgrader{status: &upgradeStatus{}}}
		err = m.unpackImage(ctx, reg, img, filepath.Join(t.TempDir(), "root"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if !strings.Contains(upgradeTmpfsOptions, "size=") || !strings.Contains(upgradeTmpfsOptions, "nr_inodes=") {
		t.Fatalf("the unpack tmpfs is not sized: %s", upgradeTmpfsOptions)
	}
}
