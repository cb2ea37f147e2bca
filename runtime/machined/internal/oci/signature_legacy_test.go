package oci

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func testKey(seed byte) (ed25519.PublicKey, ed25519.PrivateKey) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
	return priv.Public().(ed25519.PublicKey), priv
}

// sigParts is a signature as `kiln release push --sign` writes it, before a test spoils it.
type sigParts struct {
	payload  []byte // the bytes signed and stored
	stored   []byte // the blob the store serves, when not the payload
	sig      string // the layer's signature annotation
	manifest map[string]interface{}
	raw      []byte // the manifest's bytes, when not the encoded manifest
}

func canonicalPayload(digest, typ string) []byte {
	return []byte(`{"critical":{"image":{"manifest-digest":"` + digest + `"},"type":"` + typ + `"}}`)
}

// newSignature builds the signature of digest by priv; spoil (when set) changes it before the
// manifest is encoded.
func newSignature(t *testing.T, digest string, priv ed25519.PrivateKey, spoil func(*sigParts)) *sigParts {
	t.Helper()
	s := &sigParts{payload: canonicalPayload(digest, SignatureType)}
	s.sig = base64.StdEncoding.EncodeToString(ed25519.Sign(priv, s.payload))
	layer := map[string]interface{}{"mediaType": MediaTypeSignature}
	s.manifest = map[string]interface{}{
		"schemaVersion": 2,
		"mediaType":     MediaTypeManifest,
		"config":        map[string]interface{}{"mediaType": MediaTypeEmpty, "digest": EmptyDigest, "size": 2},
		"layers":        []interface{}{layer},
		"annotations":   map[string]string{AnnotationSignedDigest: digest},
	}
	if spoil != nil {
		spoil(s)
	}
	if _, ok := layer["digest"]; !ok {
		layer["digest"] = digestOf(s.payload)
	}
	if _, ok := layer["size"]; !ok {
		layer["size"] = len(s.payload)
	}
	if _, ok := layer["annotations"]; !ok {
		layer["annotations"] = map[string]string{AnnotationSignature: s.sig}
	}
	if s.stored == nil {
		s.stored = s.payload
	}
	if s.raw == nil {
		s.raw = mustJSON(t, s.manifest)
	}
	return s
}

func (s *sigParts) layer() map[string]interface{} {
	return s.manifest["layers"].([]interface{})[0].(map[string]interface{})
}

func (s *sigParts) resign(priv ed25519.PrivateKey) {
	s.sig = base64.StdEncoding.EncodeToString(ed25519.Sign(priv, s.payload))
}

// publish puts a signature into a fake registry under digest's signature tag.
func (s *sigParts) publish(f *fakeRegistry, digest string) {
	f.manifests[SignatureTag(digest)] = s.raw
	f.blobs[digestOf(s.payload)] = s.stored
}

const imageDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestSignatureConstants(t *testing.T) {
	if got := digestOf([]byte("{}")); got != EmptyDigest {
		t.Fatalf("the empty blob hashes to %s", got)
	}
	if got := SignatureTag(imageDigest); got != "sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.sig" || !tagPattern.MatchString(got) {
		t.Fatalf("tag %q", got)
	}
	pub, _ := testKey(1)
	if fp := KeyFingerprint(pub); len(fp) != 16 || strings.Trim(fp, "0123456789abcdef") != "" {
		t.Fatalf("fingerprint %q", fp)
	}
}

func TestVerifySignatureOfAResolvedImage(t *testing.T) {
	ti, f, reg, img := resolveTestImage(t)
	if img.Digest != digestOf(ti.manifest) {
		t.Fatalf("resolved %s, want the platform manifest", img.Digest)
	}
	pub, priv := testKey(1)
	other, _ := testKey(2)
	newSignature(t, img.Digest, priv, nil).publish(f, img.Digest)
	// any one trusted key suffices, wherever it is in the list
	v, err := VerifySignature(context.Background(), reg, img.Digest, []crypto.PublicKey{other, pub})
	if err != nil {
		t.Fatal(err)
	}
	if v.Signer != KeyFingerprint(pub) || !v.Legacy {
		t.Fatalf("%+v, want the first format signed by %s", v, KeyFingerprint(pub))
	}
	// the manifest is asked for as what it is
	if last := f.accepts[len(f.accepts)-1]; last != MediaTypeManifest {
		t.Fatalf("Accept %q", last)
	}
}

func TestVerifySignatureThroughTokenAuth(t *testing.T) {
	f := newFakeRegistry(t, nil)
	f.token = "secret-token"
	pub, priv := testKey(1)
	newSignature(t, imageDigest, priv, nil).publish(f, imageDigest)
	reg := f.registry()
	if _, err := VerifySignature(context.Background(), reg, imageDigest, []crypto.PublicKey{pub}); err != nil {
		t.Fatal(err)
	}
	// a missing tag behind auth is still a missing tag
	other := "sha256:" + strings.Repeat("e", 64)
	_, err := VerifySignature(context.Background(), &Registry{Host: reg.Host, Repo: reg.Repo, Insecure: true}, other, []crypto.PublicKey{pub})
	wantErr(t, err, "no signature for "+other+": the registry has no tag "+SignatureTag(other))
}

func TestVerifySignatureRefusals(t *testing.T) {
	pub, priv := testKey(1)
	_, stranger := testKey(2)
	for _, tc := range []struct {
		name  string
		spoil func(*sigParts)
		want  string
	}{
		{"another key", func(s *sigParts) { s.resign(stranger) },
			"signature of " + imageDigest + " is not by a trusted key"},
		{"payload names another digest", func(s *sigParts) {
			s.payload = canonicalPayload("sha256:"+strings.Repeat("a", 64), SignatureType)
			s.resign(priv)
		}, "signature payload names sha256:" + strings.Repeat("a", 64) + ", not the image " + imageDigest},
		{"wrong payload type", func(s *sigParts) {
			s.payload = canonicalPayload(imageDigest, "dev.kiln.something-else.v1")
			s.resign(priv)
		}, `has type "dev.kiln.something-else.v1", not dev.kiln.installer-signature.v1`},
		{"payload not JSON", func(s *sigParts) {
			s.payload = []byte("not json at all")
			s.resign(priv)
		}, "malformed signature payload"},
		{"payload with trailing data", func(s *sigParts) {
			s.payload = append(canonicalPayload(imageDigest, SignatureType), "{}"...)
			s.resign(priv)
		}, "malformed signature payload"},
		{"corrupt payload", func(s *sigParts) {
			s.stored = bytes.Replace(s.payload, []byte("critical"), []byte("CRITICAL"), 1)
		}, "digest mismatch"},
		{"payload longer than its descriptor", func(s *sigParts) {
			s.stored = append(append([]byte(nil), s.payload...), ' ')
		}, "the registry sends"},
		{"oversized payload", func(s *sigParts) {
			s.payload = append(canonicalPayload(imageDigest, SignatureType), bytes.Repeat([]byte(" "), MaxSignaturePayloadBytes)...)
			s.resign(priv)
		}, "bytes, want 1 to 4096"},
		{"two layers", func(s *sigParts) {
			s.manifest["layers"] = append(s.manifest["layers"].([]interface{}), s.layer())
		}, "2 layers, want exactly one"},
		{"a second layer of another type", func(s *sigParts) {
			s.manifest["layers"] = append(s.manifest["layers"].([]interface{}), map[string]interface{}{"mediaType": MediaTypeLayerGzip})
		}, "2 layers, want exactly one"},
		// without a layer of this format's type, the manifest is read as cosign's
		{"no layers", func(s *sigParts) { s.manifest["layers"] = []interface{}{} }, "no " + MediaTypeSimpleSigning + " layer"},
		{"wrong layer media type", func(s *sigParts) { s.layer()["mediaType"] = MediaTypeLayerGzip },
			"no " + MediaTypeSimpleSigning + " layer"},
		{"wrong manifest media type", func(s *sigParts) { s.manifest["mediaType"] = MediaTypeIndex },
			"mediaType is \"" + MediaTypeIndex + "\""},
		{"not the empty config", func(s *sigParts) {
			s.manifest["config"] = map[string]interface{}{"mediaType": MediaTypeConfig, "digest": EmptyDigest, "size": 2}
		}, "config is not the empty descriptor"},
		{"signed-digest annotation names another", func(s *sigParts) {
			s.manifest["annotations"] = map[string]string{AnnotationSignedDigest: "sha256:" + strings.Repeat("b", 64)}
		}, "dev.kiln.signed-digest annotation is"},
		{"non-base64 signature", func(s *sigParts) { s.sig = "not base64!" }, "annotation is not base64"},
		{"short signature", func(s *sigParts) { s.sig = base64.StdEncoding.EncodeToString(make([]byte, 32)) },
			"annotation holds 32 bytes, an Ed25519 signature is 64"},
		{"huge signature annotation", func(s *sigParts) { s.sig = strings.Repeat("A", 10000) }, "too long for an Ed25519 signature"},
		{"no signature annotation", func(s *sigParts) { s.layer()["annotations"] = map[string]string{} },
			"layer has no dev.kiln.signature annotation"},
		{"bad layer digest", func(s *sigParts) { s.layer()["digest"] = "sha256:../../etc" }, "is not sha256:<64 lowercase hex digits>"},
		{"negative layer size", func(s *sigParts) { s.layer()["size"] = -1 }, "negative size"},
		{"manifest not JSON", func(s *sigParts) { s.raw = []byte("<html>") }, "malformed signature manifest"},
		{"manifest too large", func(s *sigParts) {
			s.manifest["padding"] = strings.Repeat("x", MaxSignatureManifestBytes)
		}, "more than the 65536 allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRegistry(t, nil)
			newSignature(t, imageDigest, priv, tc.spoil).publish(f, imageDigest)
			_, err := VerifySignature(context.Background(), f.registry(), imageDigest, []crypto.PublicKey{pub})
			wantErr(t, err, tc.want)
			t.Log(err)
		})
	}
}

func TestVerifySignatureMissingAndFailingTag(t *testing.T) {
	pub, _ := testKey(1)
	f := newFakeRegistry(t, nil)
	_, err := VerifySignature(context.Background(), f.registry(), imageDigest, []crypto.PublicKey{pub})
	wantErr(t, err, "no signature for "+imageDigest+": the registry has no tag "+SignatureTag(imageDigest))

	// a registry that fails is a failure, not a missing signature
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		registryError(w, http.StatusInternalServerError, "UNKNOWN")
	}))
	defer srv.Close()
	failing := &Registry{Host: strings.TrimPrefix(srv.URL, "http://"), Repo: "kiln/installer", Insecure: true}
	_, err = VerifySignature(context.Background(), failing, imageDigest, []crypto.PublicKey{pub})
	wantErr(t, err, "500 Internal Server Error")
	if strings.Contains(err.Error(), "no signature") {
		t.Fatalf("a 500 is not a missing tag: %v", err)
	}
}

func TestVerifySignatureBadArguments(t *testing.T) {
	pub, priv := testKey(1)
	f := newFakeRegistry(t, nil)
	newSignature(t, imageDigest, priv, nil).publish(f, imageDigest)
	reg := f.registry()
	ctx := context.Background()
	_, err := VerifySignature(ctx, reg, "sha256:short", []crypto.PublicKey{pub})
	wantErr(t, err, "is not a sha256 digest")
	_, err = VerifySignature(ctx, reg, imageDigest, nil)
	wantErr(t, err, "no trusted keys")
	// ed25519.Verify panics on a key of the wrong size: it must never get one
	_, err = VerifySignature(ctx, reg, imageDigest, []crypto.PublicKey{pub[:16]})
	wantErr(t, err, "trusted key 0: Ed25519 key is 16 bytes")
	_, err = VerifySignature(ctx, reg, imageDigest, []crypto.PublicKey{pub, (*ecdsa.PublicKey)(nil)})
	wantErr(t, err, "trusted key 1: an ECDSA key not on P-256")
	_, err = VerifySignature(ctx, reg, imageDigest, []crypto.PublicKey{"a string"})
	wantErr(t, err, "trusted key 0: a string key")
	_, err = VerifySignature(ctx, onlySource{reg}, imageDigest, []crypto.PublicKey{pub})
	wantErr(t, err, "cannot look up tags")
}

// onlySource hides ManifestByTag.
type onlySource struct{ Source }

// Whatever the registry sends instead of the signature manifest, verification fails cleanly.
func TestVerifySignatureNeverPanicsOnMangledManifests(t *testing.T) {
	pub, priv := testKey(1)
	good := newSignature(t, imageDigest, priv, nil)
	f := newFakeRegistry(t, nil)
	good.publish(f, imageDigest)
	verifyMangled(t, f, good.raw, []crypto.PublicKey{pub})
}

func TestVerifySignatureFromLayout(t *testing.T) {
	ti := newTestImage(t)
	pub, priv := testKey(1)
	digest := digestOf(ti.manifest)
	s := newSignature(t, digest, priv, nil)
	sigDesc := descOf(MediaTypeManifest, s.raw)
	sigDesc.Annotations = map[string]string{AnnotationRefName: SignatureTag(digest)}
	amd := descOf(MediaTypeManifest, ti.manifest)
	amd.Platform = &amd64
	amd.Annotations = map[string]string{AnnotationRefName: "1.2.0"}
	es := []entry{
		file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`),
		file("index.json", string(mustJSON(t, Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{amd, sigDesc}}))),
	}
	blobs := map[string][]byte{digestOf(ti.manifest): ti.manifest, digestOf(s.raw): s.raw, digestOf(s.payload): s.payload}
	for d, b := range ti.blobs {
		blobs[d] = b
	}
	for d, b := range blobs {
		es = append(es, file("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), string(b)))
	}
	l := openLayout(t, es...)
	// the image still resolves by name and by "the only one for this platform"
	for _, ref := range []string{"1.2.0", ""} {
		img, err := l.Resolve(context.Background(), ref, amd64)
		if err != nil {
			t.Fatalf("%q: %v", ref, err)
		}
		if img.Digest != digest {
			t.Fatalf("%q resolved to %s", ref, img.Digest)
		}
	}
	v, err := VerifySignature(context.Background(), l, digest, []crypto.PublicKey{pub})
	if err != nil || v.Signer != KeyFingerprint(pub) || !v.Legacy {
		t.Fatalf("%+v %v", v, err)
	}
	_, err = VerifySignature(context.Background(), l, imageDigest, []crypto.PublicKey{pub})
	wantErr(t, err, "no signature for "+imageDigest+": the layout has no tag "+SignatureTag(imageDigest))
	other, _ := testKey(3)
	_, err = VerifySignature(context.Background(), l, digest, []crypto.PublicKey{other})
	wantErr(t, err, "is not by a trusted key")
}
