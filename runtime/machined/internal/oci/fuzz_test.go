package oci

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParseReference: never panics, and what parses prints back to itself.
func FuzzParseReference(f *testing.F) {
	for _, s := range []string{
		"ghcr.io/kiln/installer:1.2.0", "localhost:5000/a/b@sha256:" + hexA, "[::1]:5/x:y",
		"http://x/y", "a/b", "reg.example/A", "reg.example/x:", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseReference(s)
		if err != nil {
			return
		}
		if r.Host == "" || r.Repo == "" || (r.Tag == "" && r.Digest == "") {
			t.Fatalf("%q parsed to %+v", s, r)
		}
		again, err := ParseReference(r.String())
		if err != nil || again != r {
			t.Fatalf("%q -> %q -> %+v, %v", s, r.String(), again, err)
		}
	})
}

// FuzzUnpack: arbitrary bytes (a tar, or a gzip'd one when they start like gzip) never panic
// Unpack and never change anything outside the root. Symlinks are laid first so fuzzed names
// have something to try to escape through.
func FuzzUnpack(f *testing.F) {
	seeds := [][]byte{
		makeTar(f, file("a/b", "c"), symlink("s", "../.."), hardlink("h", "a/b")),
		makeTar(f, file("../x", "c")),
		makeTar(f, file("up/x", "pwned")),
		makeTar(f, file("out/x", "pwned"), whiteoutOf("out/.wh.secret")),
		makeTar(f, hardlink("h", "out/secret"), whiteoutOf(".wh..wh..opq")),
		makeTar(f, dir("d/"), symlink("d", "../.."), withMode(dir("e/"), 0o7777)),
		gzipped(f, makeTar(f, file("z", "z"))),
		{},
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base := scratch(t)
		root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
		os.Mkdir(root, 0o755)
		os.Mkdir(outside, 0o755)
		os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644)
		mt := MediaTypeLayer
		if bytes.HasPrefix(data, []byte{0x1f, 0x8b}) {
			mt = MediaTypeLayerGzip
		}
		_, _ = Unpack(root, bytes.NewReader(makeTar(t, symlink("out", outside), symlink("up", ".."))), MediaTypeLayer, testLimits)
		_, _ = Unpack(root, bytes.NewReader(data), mt, Limits{MaxBytes: 1 << 16, MaxEntries: 64})

		if got := tree(t, base); got != "outside/\noutside/secret\nroot/"+rootTree(t, root) {
			t.Fatalf("something changed outside the root:\n%s", got)
		}
		if readFile(t, filepath.Join(outside, "secret")) != "secret" {
			t.Fatal("secret changed")
		}
		filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky|os.ModeDevice|os.ModeNamedPipe|os.ModeSocket) != 0 {
				t.Fatalf("%s has mode %v", p, fi.Mode())
			}
			return nil
		})
	})
}

// rootTree is tree(root) prefixed for comparison within its parent's tree.
func rootTree(t *testing.T, root string) string {
	s := tree(t, root)
	if s == "" {
		return ""
	}
	var out bytes.Buffer
	for _, line := range bytes.Split([]byte(s), []byte("\n")) {
		out.WriteString("\nroot/")
		out.Write(line)
	}
	return out.String()
}

// TestUnpackRandomHostileLayers stacks random layers built from names and link targets chosen
// to try every escape (symlinked parents, "..", absolute names, whiteouts and hard links
// through symlinks), with a fixed seed so a failure reproduces. Nothing may change outside the
// root, and nothing may panic.
func TestUnpackRandomHostileLayers(t *testing.T) {
	names := []string{"a", "a/b", "a/b/c", "out", "out/secret", "out/new", "up", "up/outside/secret", "up/x",
		"../x", "/abs/x", "a/../../outside/secret", ".wh.a", "a/.wh.b", "a/.wh..wh..opq", ".wh..wh..opq",
		"out/.wh.secret", "up/.wh.outside", "l", "l/x", "l/y/z", "./a/./b"}
	targets := []string{"/", "..", "../..", "../outside", "../outside/secret", "a", "a/b", "out/secret", "/etc/passwd", "l"}
	rng := rand.New(rand.NewSource(1))
	for iter := 0; iter < 200; iter++ {
		base := scratch(t)
		root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
		os.Mkdir(root, 0o755)
		os.Mkdir(outside, 0o755)
		os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644)
		targets[len(targets)-1] = outside
		for layer := 0; layer < 3; layer++ {
			var es []entry
			for i := rng.Intn(8); i >= 0; i-- {
				name := names[rng.Intn(len(names))]
				switch rng.Intn(5) {
				case 0:
					es = append(es, dir(name+"/"))
				case 1:
					es = append(es, symlink(name, targets[rng.Intn(len(targets))]))
				case 2:
					es = append(es, hardlink(name, names[rng.Intn(len(names))]))
				default:
					es = append(es, file(name, "pwned"))
				}
			}
			Unpack(root, bytes.NewReader(makeTar(t, es...)), MediaTypeLayer, testLimits)
		}
		if got := tree(t, base); got != "outside/\noutside/secret\nroot/"+rootTree(t, root) {
			t.Fatalf("iteration %d: something changed outside the root:\n%s", iter, got)
		}
		if readFile(t, filepath.Join(outside, "secret")) != "secret" {
			t.Fatalf("iteration %d: secret changed", iter)
		}
	}
}

// FuzzParseContentRange: a Content-Range header parses to FIRST <= LAST < TOTAL, all
// non-negative, or is an error; never a panic.
func FuzzParseContentRange(f *testing.F) {
	for _, s := range []string{"bytes 0-511/1024", "bytes */1024", "bytes 0-0/1", "bytes 9-1/2", "bytes 0-9223372036854775807/1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		first, last, total, err := ParseContentRange(v)
		if err != nil {
			return
		}
		if first < 0 || first > last || last >= total {
			t.Fatalf("%q: %d-%d/%d", v, first, last, total)
		}
	})
}

// FuzzVerifySignature: whatever signature manifest and payload a registry serves, VerifySignature
// never panics, and it succeeds only for a payload a trusted key signed that names the image.
func FuzzVerifySignature(f *testing.F) {
	ec := ecdsaKey(f)
	edPub, edPriv := testKey(1)
	keys := []crypto.PublicKey{edPub, &ec.PublicKey}
	good := newCosign(f, imageDigest, ec, nil)
	f.Add(good.raw, good.payloads[0])
	two := newCosign(f, imageDigest, ec, func(c *cosignParts) { c.add(c.payloads[0], "QUJD") })
	f.Add(two.raw, two.payloads[0])
	legacy := canonicalPayload(imageDigest, SignatureType)
	legacyManifest := mustJSON(f, map[string]interface{}{
		"schemaVersion": 2, "mediaType": MediaTypeManifest,
		"config": map[string]interface{}{"mediaType": MediaTypeEmpty, "digest": EmptyDigest, "size": 2},
		"layers": []interface{}{map[string]interface{}{
			"mediaType": MediaTypeSignature, "digest": digestOf(legacy), "size": len(legacy),
			"annotations": map[string]string{AnnotationSignature: base64.StdEncoding.EncodeToString(ed25519.Sign(edPriv, legacy))},
		}},
		"annotations": map[string]string{AnnotationSignedDigest: imageDigest},
	})
	f.Add(legacyManifest, legacy)
	f.Add([]byte(`{"schemaVersion":2,"mediaType":"`+MediaTypeManifest+`","layers":[{"mediaType":"`+MediaTypeSimpleSigning+`"}]}`), []byte("{}"))
	f.Add([]byte("null"), []byte{})
	f.Fuzz(func(t *testing.T, manifest, payload []byte) {
		src := memSource{
			manifests: map[string][]byte{SignatureTag(imageDigest): manifest},
			blobs:     map[string][]byte{digestOf(payload): payload},
		}
		v, err := VerifySignature(context.Background(), src, imageDigest, keys)
		if err != nil {
			return
		}
		if v.Signer != KeyFingerprint(edPub) && v.Signer != KeyFingerprint(&ec.PublicKey) {
			t.Fatalf("verified with signer %q", v.Signer)
		}
		if !bytes.Contains(payload, []byte(imageDigest)) {
			t.Fatalf("verified a payload that does not name the image: %q", payload)
		}
	})
}

// FuzzParsePublicKeyPEM: never panics; what parses is a usable release key that prints back to
// the same PEM.
func FuzzParsePublicKeyPEM(f *testing.F) {
	ec := ecdsaKey(f)
	edPub, _ := testKey(1)
	for _, k := range []crypto.PublicKey{&ec.PublicKey, edPub} {
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(pemOf(f, "PUBLIC KEY", der))
		f.Add(pemOf(f, "PUBLIC KEY", der[:len(der)-3]))
	}
	f.Add("-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n")
	f.Fuzz(func(t *testing.T, text string) {
		key, err := ParsePublicKeyPEM(text)
		if err != nil {
			return
		}
		if err := checkTrustedKey(key); err != nil {
			t.Fatalf("parsed an unusable key: %v", err)
		}
		der, err := x509.MarshalPKIXPublicKey(key)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParsePublicKeyPEM(pemOf(t, "PUBLIC KEY", der))
		if err != nil || KeyFingerprint(again) != KeyFingerprint(key) {
			t.Fatalf("%v %v", again, err)
		}
	})
}
