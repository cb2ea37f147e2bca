package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
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

// signedBy lays out digest's signature by priv as `kiln release push --sign` does.
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
	trusted, stranger := seededKey(1), seededKey(2)
	trustedPub := trusted.Public().(ed25519.PublicKey)
	withKeys := &Config{ReleaseKeys: []string{releaseKeyPEM(t, trustedPub)}}
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
	signer, err := m.checkSignature(ctx, signatureRegistry(t, signedBy(t, upgradeDigest, trusted)), upgradeDigest)
	if err != nil {
		t.Fatal(err)
	}
	if signer != oci.KeyFingerprint(trustedPub) {
		t.Fatalf("signer %q", signer)
	}
	want := "machined: upgrade: signature of " + upgradeDigest + " by release key " + signer
	if lines := m.con.log.Lines(); len(lines) != 1 || strings.TrimSpace(lines[0]) != want {
		t.Fatalf("logged %q, want %q", lines, want)
	}

	// no signature, or one by another key: the upgrade stops here, before anything is unpacked
	// (pullAndInstall calls checkSignature right after Resolve and returns its error)
	for name, tc := range map[string]struct {
		files map[string][]byte
		want  string
	}{
		"unsigned":    {map[string][]byte{}, "no signature for " + upgradeDigest + ": the registry has no tag " + oci.SignatureTag(upgradeDigest)},
		"another key": {signedBy(t, upgradeDigest, stranger), "signature of " + upgradeDigest + " is not by a trusted key"},
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
