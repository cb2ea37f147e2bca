package oci

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func ecdsaKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func cosignPayload(digest string) []byte {
	return []byte(`{"critical":{"identity":{"docker-reference":"registry.example/kiln/installer"},"image":{"docker-manifest-digest":"` +
		digest + `"},"type":"cosign container image signature"},"optional":{"creator":"Kiln"}}`)
}

func signECDSA(t testing.TB, priv *ecdsa.PrivateKey, payload []byte) string {
	t.Helper()
	sum := sha256.Sum256(payload)
	sig, err := ecdsa.SignASN1(rand.Reader, priv, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(sig)
}

// cosignParts is a signature manifest of one or more simple-signing layers, as `kiln release
// push --sign` (one) and cosign (one per signer) write it, before a test spoils it.
type cosignParts struct {
	payloads [][]byte          // the blob of each layer
	stored   map[string][]byte // what the store serves, by digest, when not the payloads
	manifest map[string]interface{}
	raw      []byte
}

// newCosign signs digest with priv in one layer; spoil (when set) changes the parts before the
// manifest is encoded.
func newCosign(t testing.TB, digest string, priv *ecdsa.PrivateKey, spoil func(*cosignParts)) *cosignParts {
	t.Helper()
	c := &cosignParts{stored: map[string][]byte{}}
	config := []byte(`{"architecture":"","os":"","rootfs":{"type":"layers","diff_ids":[]},"config":{}}`)
	c.manifest = map[string]interface{}{
		"schemaVersion": 2,
		"mediaType":     MediaTypeManifest,
		"config":        map[string]interface{}{"mediaType": MediaTypeConfig, "digest": digestOf(config), "size": len(config)},
		"layers":        []interface{}{},
	}
	c.add(cosignPayload(digest), signECDSA(t, priv, cosignPayload(digest)))
	if spoil != nil {
		spoil(c)
	}
	if c.raw == nil {
		c.raw = mustJSON(t, c.manifest)
	}
	return c
}

// add appends a signature layer of payload with the signature annotation sig.
func (c *cosignParts) add(payload []byte, sig string) {
	c.payloads = append(c.payloads, payload)
	c.manifest["layers"] = append(c.manifest["layers"].([]interface{}), map[string]interface{}{
		"mediaType":   MediaTypeSimpleSigning,
		"digest":      digestOf(payload),
		"size":        len(payload),
		"annotations": map[string]string{AnnotationCosignSignature: sig},
	})
}

func (c *cosignParts) layer(i int) map[string]interface{} {
	return c.manifest["layers"].([]interface{})[i].(map[string]interface{})
}

// resign replaces layer 0's payload and signs it with priv.
func (c *cosignParts) resign(t testing.TB, priv *ecdsa.PrivateKey, payload []byte) {
	c.payloads[0] = payload
	l := c.layer(0)
	l["digest"], l["size"] = digestOf(payload), len(payload)
	l["annotations"] = map[string]string{AnnotationCosignSignature: signECDSA(t, priv, payload)}
}

func (c *cosignParts) publish(f *fakeRegistry, digest string) {
	f.manifests[SignatureTag(digest)] = c.raw
	for _, p := range c.payloads {
		f.blobs[digestOf(p)] = p
	}
	for d, b := range c.stored {
		f.blobs[d] = b
	}
}

func TestVerifyCosignSignatureOfAResolvedImage(t *testing.T) {
	_, f, reg, img := resolveTestImage(t)
	priv, other := ecdsaKey(t), ecdsaKey(t)
	edPub, _ := testKey(1)
	newCosign(t, img.Digest, priv, nil).publish(f, img.Digest)
	// any one trusted key suffices, wherever it is in the list, whatever the others' types
	v, err := VerifySignature(context.Background(), reg, img.Digest, []crypto.PublicKey{edPub, &other.PublicKey, &priv.PublicKey})
	if err != nil {
		t.Fatal(err)
	}
	if v.Signer != KeyFingerprint(&priv.PublicKey) || v.Legacy {
		t.Fatalf("%+v, want the cosign format signed by %s", v, KeyFingerprint(&priv.PublicKey))
	}
	der, _ := x509.MarshalPKIXPublicKey(&priv.PublicKey)
	if sum := sha256.Sum256(der); v.Signer != hex.EncodeToString(sum[:8]) {
		t.Fatalf("fingerprint %s is not the DER's sha256", v.Signer)
	}
}

// fixtureSource serves a signature fixture from testdata/DIR: its digest, its public key, and a
// source holding its manifest under the signature tag and its payload and config blobs.
func fixtureSource(t *testing.T, dir string) (string, crypto.PublicKey, memSource) {
	t.Helper()
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("testdata", dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	digest := strings.TrimSpace(string(read("digest")))
	key, err := ParsePublicKeyPEM(string(read("key.pub")))
	if err != nil {
		t.Fatal(err)
	}
	payload, config := read("payload.json"), read("config.json")
	return digest, key, memSource{
		manifests: map[string][]byte{SignatureTag(digest): read("manifest.json")},
		blobs:     map[string][]byte{digestOf(payload): payload, digestOf(config): config},
	}
}

// The signature the Python side writes (tests/unit/cosign_golden.py made testdata/cosign, and a
// Python test checks it is still what it writes) verifies here, with the same fingerprint; so
// does one cosign 2.5 made (`cosign sign --key` over a pushed installer, testdata/cosign-made).
func TestVerifyGoldenSignatures(t *testing.T) {
	for _, dir := range []string{"cosign", "cosign-made"} {
		t.Run(dir, func(t *testing.T) {
			digest, key, src := fixtureSource(t, dir)
			v, err := VerifySignature(context.Background(), src, digest, []crypto.PublicKey{key})
			if err != nil {
				t.Fatal(err)
			}
			if v.Signer != KeyFingerprint(key) || v.Legacy {
				t.Fatalf("%+v", v)
			}
			if b, err := os.ReadFile(filepath.Join("testdata", dir, "fingerprint")); err == nil && strings.TrimSpace(string(b)) != v.Signer {
				t.Fatalf("signer %s, the Python side says %s", v.Signer, b)
			}
			// the same signature put beside another image: its payload names the fixture's digest
			other := "sha256:" + strings.Repeat("7", 64)
			src.manifests[SignatureTag(other)] = src.manifests[SignatureTag(digest)]
			_, err = VerifySignature(context.Background(), src, other, []crypto.PublicKey{key})
			wantErr(t, err, "signature payload names "+digest+", not the image "+other)
			_, err = VerifySignature(context.Background(), src, digest, []crypto.PublicKey{&ecdsaKey(t).PublicKey})
			wantErr(t, err, "signature of "+digest+" is not by a trusted key")
			// a tampered payload, stored under its own digest so only the signature can tell
			manifest := src.manifests[SignatureTag(digest)]
			var m Manifest
			if err := json.Unmarshal(manifest, &m); err != nil {
				t.Fatal(err)
			}
			payload := src.blobs[m.Layers[0].Digest]
			tampered := bytes.Replace(payload, []byte(`"critical"`), []byte(`"critical" `), 1)
			src.manifests[SignatureTag(digest)] = bytes.Replace(bytes.Replace(manifest, []byte(digestOf(payload)), []byte(digestOf(tampered)), 1),
				[]byte(fmt.Sprintf(`"size":%d`, len(payload))), []byte(fmt.Sprintf(`"size":%d`, len(tampered))), 1)
			src.blobs[digestOf(tampered)] = tampered
			_, err = VerifySignature(context.Background(), src, digest, []crypto.PublicKey{key})
			wantErr(t, err, "signature of "+digest+" is not by a trusted key")
		})
	}
}

// memSource serves signature manifests by tag and blobs by digest from memory.
type memSource struct {
	manifests map[string][]byte
	blobs     map[string][]byte
}

func (s memSource) Resolve(context.Context, string, Platform) (Image, error) {
	return Image{}, errors.New("memSource resolves nothing")
}

func (s memSource) Blob(_ context.Context, d Descriptor) (io.ReadCloser, error) {
	b, ok := s.blobs[d.Digest]
	if !ok {
		return nil, errors.New("no such blob")
	}
	return newVerifier(bytes.NewReader(b), d), nil
}

func (s memSource) ManifestByTag(_ context.Context, tag string, max int64) ([]byte, error) {
	b, ok := s.manifests[tag]
	if !ok {
		return nil, &noTagError{where: "memory", tag: tag}
	}
	return readLimited(bytes.NewReader(b), max, "manifest "+quote(tag))
}

func TestVerifyCosignRefusals(t *testing.T) {
	priv, stranger := ecdsaKey(t), ecdsaKey(t)
	other := "sha256:" + strings.Repeat("a", 64)
	for _, tc := range []struct {
		name  string
		spoil func(*cosignParts)
		want  string
	}{
		{"another key", func(c *cosignParts) { c.resign(t, stranger, c.payloads[0]) },
			"signature of " + imageDigest + " is not by a trusted key"},
		{"payload names another digest", func(c *cosignParts) { c.resign(t, priv, cosignPayload(other)) },
			"signature payload names " + other + ", not the image " + imageDigest},
		{"payload names no digest", func(c *cosignParts) {
			c.resign(t, priv, bytes.Replace(cosignPayload(imageDigest), []byte(imageDigest), []byte("../../x"), 1))
		}, `signature payload names "../../x", not the image`},
		{"payload with a changed byte", func(c *cosignParts) {
			tampered := bytes.Replace(c.payloads[0], []byte("Kiln"), []byte("Evil"), 1)
			c.payloads[0] = tampered
			c.layer(0)["digest"] = digestOf(tampered)
		}, "signature of " + imageDigest + " is not by a trusted key"},
		{"payload not what its descriptor names", func(c *cosignParts) {
			c.stored[digestOf(c.payloads[0])] = bytes.Replace(c.payloads[0], []byte("Kiln"), []byte("Evil"), 1)
		}, "digest mismatch"},
		{"payload longer than its descriptor", func(c *cosignParts) {
			c.stored[digestOf(c.payloads[0])] = append(append([]byte(nil), c.payloads[0]...), ' ')
		}, "the registry sends"},
		{"oversized payload", func(c *cosignParts) {
			c.resign(t, priv, append(cosignPayload(imageDigest), bytes.Repeat([]byte(" "), MaxSignaturePayloadBytes)...))
		}, "bytes, want 1 to 4096"},
		{"wrong payload type", func(c *cosignParts) {
			c.resign(t, priv, bytes.Replace(cosignPayload(imageDigest), []byte("cosign container image signature"), []byte("atomic container signature"), 1))
		}, `has type "atomic container signature", not "cosign container image signature"`},
		{"payload without an identity", func(c *cosignParts) {
			c.resign(t, priv, []byte(`{"critical":{"image":{"docker-manifest-digest":"`+imageDigest+`"},"type":"cosign container image signature"}}`))
		}, "no critical.identity.docker-reference"},
		{"payload not JSON", func(c *cosignParts) { c.resign(t, priv, []byte("not json")) }, "malformed signature payload"},
		{"payload with trailing data", func(c *cosignParts) { c.resign(t, priv, append(cosignPayload(imageDigest), "{}"...)) },
			"malformed signature payload"},
		{"non-base64 signature", func(c *cosignParts) {
			c.layer(0)["annotations"] = map[string]string{AnnotationCosignSignature: "not base64!"}
		}, "annotation is not base64"},
		{"huge signature annotation", func(c *cosignParts) {
			c.layer(0)["annotations"] = map[string]string{AnnotationCosignSignature: strings.Repeat("A", 10000)}
		}, "annotation is 10000 characters, more than 512"},
		{"garbage signature", func(c *cosignParts) {
			c.layer(0)["annotations"] = map[string]string{AnnotationCosignSignature: base64.StdEncoding.EncodeToString([]byte("garbage"))}
		}, "is not by a trusted key"},
		{"no signature annotation", func(c *cosignParts) { c.layer(0)["annotations"] = map[string]string{} },
			"layer 0 has no dev.cosignproject.cosign/signature annotation"},
		{"no simple-signing layer", func(c *cosignParts) { c.layer(0)["mediaType"] = MediaTypeLayerGzip },
			"no " + MediaTypeSimpleSigning + " layer"},
		{"too many layers", func(c *cosignParts) {
			for i := 0; i < MaxSignatureLayers; i++ {
				c.add(c.payloads[0], signECDSA(t, priv, c.payloads[0]))
			}
		}, "17 layers, more than the 16 looked at"},
		{"bad layer digest", func(c *cosignParts) { c.layer(0)["digest"] = "sha256:../../etc" }, "is not sha256:<64 lowercase hex digits>"},
		{"negative layer size", func(c *cosignParts) { c.layer(0)["size"] = -1 }, "negative size"},
		{"empty payload", func(c *cosignParts) { c.layer(0)["size"] = 0 }, "payload is 0 bytes"},
		{"an index, not a manifest", func(c *cosignParts) { c.manifest["mediaType"] = MediaTypeIndex }, "mediaType is \"" + MediaTypeIndex + "\""},
		{"schema version 1", func(c *cosignParts) { c.manifest["schemaVersion"] = 1 }, "schemaVersion is 1, want 2"},
		{"manifest not JSON", func(c *cosignParts) { c.raw = []byte("<html>") }, "malformed signature manifest"},
		{"manifest too large", func(c *cosignParts) {
			c.manifest["padding"] = strings.Repeat("x", MaxSignatureManifestBytes)
		}, "more than the 65536 allowed"},
		{"two signatures, neither good", func(c *cosignParts) {
			c.resign(t, stranger, c.payloads[0])
			c.add(cosignPayload(other), signECDSA(t, priv, cosignPayload(other)))
		}, "none of the 2 signatures of " + imageDigest + " holds; the first: signature of " + imageDigest + " is not by a trusted key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRegistry(t, nil)
			newCosign(t, imageDigest, priv, tc.spoil).publish(f, imageDigest)
			_, err := VerifySignature(context.Background(), f.registry(), imageDigest, []crypto.PublicKey{&priv.PublicKey})
			wantErr(t, err, tc.want)
			t.Log(err)
		})
	}
}

// A manifest cosign added to: another signer's layer and an attestation beside Kiln's; the
// first layer that holds is enough, and layers of other types are never fetched.
func TestVerifyCosignTakesAnyGoodLayer(t *testing.T) {
	priv, stranger := ecdsaKey(t), ecdsaKey(t)
	f := newFakeRegistry(t, nil)
	c := newCosign(t, imageDigest, stranger, func(c *cosignParts) {
		c.manifest["layers"] = append(c.manifest["layers"].([]interface{}), map[string]interface{}{
			"mediaType": "application/vnd.dsse.envelope.v1+json", "digest": "sha256:" + strings.Repeat("f", 64), "size": 1 << 30,
		})
		c.add(cosignPayload(imageDigest), signECDSA(t, priv, cosignPayload(imageDigest)))
	})
	c.publish(f, imageDigest)
	v, err := VerifySignature(context.Background(), f.registry(), imageDigest, []crypto.PublicKey{&priv.PublicKey})
	if err != nil || v.Signer != KeyFingerprint(&priv.PublicKey) {
		t.Fatalf("%+v %v", v, err)
	}
}

// skopeo and cosign's key loaders take an Ed25519 PEM too: pure Ed25519 over the payload.
func TestVerifyCosignWithAnEd25519Key(t *testing.T) {
	pub, priv := testKey(4)
	f := newFakeRegistry(t, nil)
	newCosign(t, imageDigest, ecdsaKey(t), func(c *cosignParts) {
		c.layer(0)["annotations"] = map[string]string{AnnotationCosignSignature: base64.StdEncoding.EncodeToString(ed25519.Sign(priv, c.payloads[0]))}
	}).publish(f, imageDigest)
	v, err := VerifySignature(context.Background(), f.registry(), imageDigest, []crypto.PublicKey{pub})
	if err != nil || v.Signer != KeyFingerprint(pub) || v.Legacy {
		t.Fatalf("%+v %v", v, err)
	}
}

func pemOf(t testing.TB, typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func TestParsePublicKeyPEM(t *testing.T) {
	pub, _ := testKey(1)
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	good := pemOf(t, "PUBLIC KEY", der)
	got, err := ParsePublicKeyPEM("\n" + good + "\n")
	if err != nil || !bytes.Equal(got.(ed25519.PublicKey), pub) {
		t.Fatalf("%x %v", got, err)
	}
	ec := ecdsaKey(t)
	ecDER, _ := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	got, err = ParsePublicKeyPEM(pemOf(t, "PUBLIC KEY", ecDER))
	if err != nil || !ec.PublicKey.Equal(got) {
		t.Fatalf("ECDSA P-256: %v %v", got, err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	rsaDER, _ := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p384DER, _ := x509.MarshalPKIXPublicKey(&p384.PublicKey)
	for text, want := range map[string]string{
		"":                                 "not a PEM public key",
		"ssh-ed25519 AAAA... user@host":    "not a PEM public key",
		pemOf(t, "PRIVATE KEY", der):       `PEM block is "PRIVATE KEY"`,
		pemOf(t, "PUBLIC KEY", rsaDER):     "an RSA key",
		pemOf(t, "PUBLIC KEY", p384DER):    "an ECDSA key not on P-256",
		pemOf(t, "PUBLIC KEY", der[:20]):   "PUBLIC KEY: ",
		pemOf(t, "PUBLIC KEY", ecDER[:40]): "PUBLIC KEY: ",
		good + good:                        "more than one PEM block",
		pemOf(t, "PUBLIC KEY", []byte{0}):  "PUBLIC KEY: ",
		pemOf(t, "PUBLIC KEY", der) + "xx": "text after it",
	} {
		if _, err := ParsePublicKeyPEM(text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", text, err, want)
		}
	}
}

// Whatever the registry sends instead of the signature manifest, verification fails cleanly.
func TestVerifyCosignNeverPanicsOnMangledManifests(t *testing.T) {
	priv := ecdsaKey(t)
	good := newCosign(t, imageDigest, priv, nil)
	f := newFakeRegistry(t, nil)
	good.publish(f, imageDigest)
	verifyMangled(t, f, good.raw, []crypto.PublicKey{&priv.PublicKey})
}

// A key handed in off its curve is refused before Go's P-256 code could panic on it.
func TestVerifyRefusesAnECDSAKeyOffItsCurve(t *testing.T) {
	priv := ecdsaKey(t)
	f := newFakeRegistry(t, nil)
	newCosign(t, imageDigest, priv, nil).publish(f, imageDigest)
	off := &ecdsa.PublicKey{Curve: elliptic.P256(), X: big.NewInt(1), Y: big.NewInt(1)}
	_, err := VerifySignature(context.Background(), f.registry(), imageDigest, []crypto.PublicKey{&priv.PublicKey, off})
	wantErr(t, err, "trusted key 1: an ECDSA key not on P-256")
}
