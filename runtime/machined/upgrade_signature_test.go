package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"kiln/machined/internal/oci"
)

func releaseKeyPEM(t *testing.T, pub ed25519.PublicKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// seededECDSA is a P-256 key (an image release key); seed only tells the calls apart.
func seededECDSA(t *testing.T, seed byte) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func ecdsaKeyPEM(t *testing.T, pub *ecdsa.PublicKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func seededKey(seed byte) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
}

func sha256Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// signatureRegistry serves one repository's manifests by tag and blobs by digest, plainly.
func signatureRegistry(t *testing.T, files map[string][]byte) *oci.Registry {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[strings.TrimPrefix(r.URL.Path, "/v2/kiln/installer/")]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"errors":[{"code":"MANIFEST_UNKNOWN","message":"not here"}]}`))
			return
		}
		w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return &oci.Registry{Host: strings.TrimPrefix(srv.URL, "http://"), Repo: "kiln/installer", Insecure: true, Timeout: 5 * time.Second}
}

// cosignSignedBy lays out digest's signature by priv as `kiln release push --sign` does (and
// cosign): a simple-signing payload, its ECDSA signature in the layer's annotation.
func cosignSignedBy(t *testing.T, digest string, priv *ecdsa.PrivateKey) map[string][]byte {
	payload := []byte(`{"critical":{"identity":{"docker-reference":"registry.example/kiln/installer"},` +
		`"image":{"docker-manifest-digest":"` + digest + `"},"type":"cosign container image signature"},"optional":null}`)
	sum := sha256.Sum256(payload)
	sig, err := ecdsa.SignASN1(rand.Reader, priv, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	config := []byte(`{"rootfs":{"type":"layers","diff_ids":["` + sha256Digest(payload) + `"]}}`)
	manifest, err := json.Marshal(map[string]interface{}{
		"schemaVersion": 2,
		"mediaType":     oci.MediaTypeManifest,
		"config":        map[string]interface{}{"mediaType": oci.MediaTypeConfig, "digest": sha256Digest(config), "size": len(config)},
		"layers": []interface{}{map[string]interface{}{
			"mediaType":   oci.MediaTypeSimpleSigning,
			"digest":      sha256Digest(payload),
			"size":        len(payload),
			"annotations": map[string]string{oci.AnnotationCosignSignature: base64.StdEncoding.EncodeToString(sig)},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"manifests/" + oci.SignatureTag(digest): manifest,
		"blobs/" + sha256Digest(payload):        payload,
	}
}

// signedBy lays out digest's signature by priv in the first Kiln format.
func signedBy(t *testing.T, digest string, priv ed25519.PrivateKey) map[string][]byte {
	payload := []byte(`{"critical":{"image":{"manifest-digest":"` + digest + `"},"type":"dev.kiln.installer-signature.v1"}}`)
	manifest, err := json.Marshal(map[string]interface{}{
		"schemaVersion": 2,
		"mediaType":     oci.MediaTypeManifest,
		"config":        map[string]interface{}{"mediaType": oci.MediaTypeEmpty, "digest": oci.EmptyDigest, "size": 2},
		"layers": []interface{}{map[string]interface{}{
			"mediaType":   oci.MediaTypeSignature,
			"digest":      sha256Digest(payload),
			"size":        len(payload),
			"annotations": map[string]string{oci.AnnotationSignature: base64.StdEncoding.EncodeToString(ed25519.Sign(priv, payload))},
		}},
		"annotations": map[string]string{oci.AnnotationSignedDigest: digest},
	})
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"manifests/" + oci.SignatureTag(digest): manifest,
		"blobs/" + sha256Digest(payload):        payload,
	}
}

const upgradeDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestUpgradeSignatureCheck(t *testing.T) {
	trusted, stranger := seededECDSA(t, 1), seededECDSA(t, 2)
	withKeys := &Config{ReleaseKeys: []string{ecdsaKeyPEM(t, &trusted.PublicKey)}}
	ctx := context.Background()

	// without release keys nothing is fetched: refused, unless allow_unsigned says otherwise
	// (upgrade_policy_test.go has the rest of the policy)
	m := &machine{con: quietConsole(), cfg: &Config{}}
	unreachable := &oci.Registry{Host: "127.0.0.1:1", Repo: "kiln/installer", Insecure: true}
	if signer, err := m.checkSignature(ctx, unreachable, upgradeDigest); signer != "" || err != errNoReleaseKeys {
		t.Fatalf("no keys: %q %v", signer, err)
	}

	// a good signature: the key's fingerprint, and one console line
	m = &machine{con: quietConsole(), cfg: withKeys}
	signer, err := m.checkSignature(ctx, signatureRegistry(t, cosignSignedBy(t, upgradeDigest, trusted)), upgradeDigest)
	if err != nil {
		t.Fatal(err)
	}
	if signer != oci.KeyFingerprint(&trusted.PublicKey) {
		t.Fatalf("signer %q", signer)
	}
	want := "machined: upgrade: signature of " + upgradeDigest + " by release key " + signer
	if lines := m.con.log.Lines(); len(lines) != 1 || strings.TrimSpace(lines[0]) != want {
		t.Fatalf("logged %q, want %q", lines, want)
	}

	// no signature, one by a key release_keys does not list, or one in the first format with
	// no Ed25519 key to check it: the upgrade stops here, before anything is unpacked
	// (pullAndInstall calls checkSignature right after Resolve and returns its error)
	for name, tc := range map[string]struct {
		files map[string][]byte
		want  string
	}{
		"unsigned":    {map[string][]byte{}, "no signature for " + upgradeDigest + ": the registry has no tag " + oci.SignatureTag(upgradeDigest)},
		"another key": {cosignSignedBy(t, upgradeDigest, stranger), "signature of " + upgradeDigest + " is not by a trusted key"},
		"first format, no Ed25519 key": {signedBy(t, upgradeDigest, seededKey(1)),
			"signature of " + upgradeDigest + " is in the first Kiln format, which only an Ed25519 release key (release.pub) in release_keys checks; re-sign the image with kiln release push --sign KEYDIR"},
	} {
		m = &machine{con: quietConsole(), cfg: withKeys}
		signer, err := m.checkSignature(ctx, signatureRegistry(t, tc.files), upgradeDigest)
		if err == nil || err.Error() != tc.want || signer != "" {
			t.Errorf("%s: %q %v, want the error %q", name, signer, err, tc.want)
		}
		if lines := m.con.log.Lines(); len(lines) != 0 {
			t.Errorf("%s: logged %q", name, lines)
		}
	}
}

// An image signed in the first Kiln format still installs, for one release, with the Ed25519
// release key in release_keys; the log says how to re-sign it and when it stops.
func TestUpgradeAcceptsTheFirstSignatureFormatForOneRelease(t *testing.T) {
	legacy, image := seededKey(1), seededECDSA(t, 1)
	cfg := &Config{ReleaseKeys: []string{ecdsaKeyPEM(t, &image.PublicKey), releaseKeyPEM(t, legacy.Public().(ed25519.PublicKey))}}
	m := &machine{con: quietConsole(), cfg: cfg}
	signer, err := m.checkSignature(context.Background(), signatureRegistry(t, signedBy(t, upgradeDigest, legacy)), upgradeDigest)
	if err != nil || signer != oci.KeyFingerprint(legacy.Public()) {
		t.Fatalf("%q %v", signer, err)
	}
	want := "machined: upgrade: signature of " + upgradeDigest + " by release key " + signer + ", in the first Kiln signature " +
		"format, which machined refuses from Kiln 0.3.0: re-sign the image with kiln release push --sign KEYDIR"
	if lines := m.con.log.Lines(); len(lines) != 1 || strings.TrimSpace(lines[0]) != want {
		t.Fatalf("logged %q, want %q", lines, want)
	}
	// the same machine takes the cosign format by its image key
	m = &machine{con: quietConsole(), cfg: cfg}
	signer, err = m.checkSignature(context.Background(), signatureRegistry(t, cosignSignedBy(t, upgradeDigest, image)), upgradeDigest)
	if err != nil || signer != oci.KeyFingerprint(&image.PublicKey) {
		t.Fatalf("%q %v", signer, err)
	}
}

func TestUpgradeStatusSignedBy(t *testing.T) {
	b, err := json.Marshal(upgradeStatus{State: upgradePulling})
	if err != nil || strings.Contains(string(b), "signed_by") {
		t.Fatalf("unchecked: %s %v", b, err)
	}
	b, err = json.Marshal(upgradeStatus{State: upgradePulling, SignedBy: "0123456789abcdef"})
	if err != nil || !strings.Contains(string(b), `"signed_by":"0123456789abcdef"`) {
		t.Fatalf("checked: %s %v", b, err)
	}
}
