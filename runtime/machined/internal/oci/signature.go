package oci

// Installer signatures, as `kiln release push --sign KEYDIR` writes them: sigstore's "simple
// signing" format as cosign writes it with a key, so cosign and skopeo check the same images. The
// signed thing is an image manifest digest D (for a multi-arch release, each platform's manifest
// is signed on its own). In the same repository the tag sha256-<hex of D>.sig names an OCI image
// manifest whose layers of media type MediaTypeSimpleSigning are signatures: each one's blob is
// a payload of at most MaxSignaturePayloadBytes,
//
//	{"critical":{"identity":{"docker-reference":"HOST/REPO"},"image":{"docker-manifest-digest":"<D>"},
//	 "type":"cosign container image signature"},"optional":{...}}
//
// and its dev.cosignproject.cosign/signature annotation the base64 signature over the payload's
// bytes: ECDSA P-256 over SHA-256 (ASN.1 DER), or pure Ed25519 for an Ed25519 key, as sigstore's
// verifiers take it. Kiln writes one such layer; cosign adds one per signer, so the first layer
// that holds for a trusted key and names D is enough. Other layers are not read. The
// docker-reference is not checked, as cosign does not: a mirror under another name verifies the
// same. signature_legacy.go reads the first Kiln format, for one release more.

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// The signature format's names and bounds.
const (
	MediaTypeSimpleSigning    = "application/vnd.dev.cosign.simplesigning.v1+json"
	AnnotationCosignSignature = "dev.cosignproject.cosign/signature"
	CosignSignatureType       = "cosign container image signature"

	MaxSignatureManifestBytes = 64 << 10
	MaxSignaturePayloadBytes  = 4 << 10
	MaxSignatureLayers        = 16  // layers of a signature manifest looked at
	MaxSignatureText          = 512 // characters of a signature annotation (ECDSA P-256: at most 96)
	MaxTrustedKeys            = 16
)

// CosignPayload is the signed document of the simple-signing format.
type CosignPayload struct {
	Critical struct {
		Identity struct {
			DockerReference *string `json:"docker-reference"`
		} `json:"identity"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
}

// Verified is a signature that held: the fingerprint of the key that made it, and whether it
// is in the first Kiln format (accepted until Kiln LegacySignatureUntil).
type Verified struct {
	Signer string
	Legacy bool
}

// ErrNoTag is what ManifestByTag's error wraps when the tag names nothing.
var ErrNoTag = errors.New("no such tag")

type noTagError struct{ where, tag string }

func (e *noTagError) Error() string        { return "the " + e.where + " has no tag " + e.tag }
func (e *noTagError) Is(target error) bool { return target == ErrNoTag }

// TaggedSource is a Source that can also read a manifest by tag, as it is, without following
// it to an image: Registry and Layout both are.
type TaggedSource interface {
	Source
	// ManifestByTag returns the bytes of the manifest tag names, at most max of them, or an
	// error wrapping ErrNoTag when the tag names nothing.
	ManifestByTag(ctx context.Context, tag string, max int64) ([]byte, error)
}

var (
	_ TaggedSource = (*Registry)(nil)
	_ TaggedSource = (*Layout)(nil)
)

// SignatureTag is the tag of digest's signature manifest: "sha256-<hex>.sig".
func SignatureTag(digest string) string {
	return strings.Replace(digest, ":", "-", 1) + ".sig"
}

// KeyFingerprint names a public key by the first 16 hex digits of a sha256 (what `kiln
// release push --sign` and `kiln verify` print): of an Ed25519 key's 32 bytes, of any other
// key's DER SubjectPublicKeyInfo.
func KeyFingerprint(key crypto.PublicKey) string {
	var sum [32]byte
	if k, ok := key.(ed25519.PublicKey); ok {
		sum = sha256.Sum256(k)
	} else if der, err := x509.MarshalPKIXPublicKey(key); err == nil {
		sum = sha256.Sum256(der)
	}
	return hex.EncodeToString(sum[:])[:16]
}

// ParsePublicKeyPEM reads one PEM "PUBLIC KEY" block (PKIX) holding an ECDSA P-256 key (what
// `kiln keys generate` writes as release-image.pub) or an Ed25519 key (release.pub, for images
// in the first Kiln format), and nothing else.
func ParsePublicKeyPEM(text string) (crypto.PublicKey, error) {
	block, rest := pem.Decode([]byte(text))
	if block == nil {
		return nil, errors.New("not a PEM public key (-----BEGIN PUBLIC KEY-----)")
	}
	if block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("PEM block is %s, want PUBLIC KEY", quote(block.Type))
	}
	if strings.TrimSpace(string(rest)) != "" {
		return nil, errors.New("more than one PEM block, or text after it")
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("PUBLIC KEY: %v", err)
	}
	if err := checkTrustedKey(key); err != nil {
		return nil, err
	}
	return key, nil
}

// checkTrustedKey refuses a key the verifier cannot use: release keys are ECDSA P-256 or Ed25519.
func checkTrustedKey(key crypto.PublicKey) error {
	switch k := key.(type) {
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return fmt.Errorf("Ed25519 key is %d bytes, want %d", len(k), ed25519.PublicKeySize)
		}
		return nil
	case *ecdsa.PublicKey:
		// Go's P-256 code panics on a point off the curve: a key must be on it before it is used
		if k == nil || k.Curve != elliptic.P256() || k.X == nil || k.Y == nil || !k.Curve.IsOnCurve(k.X, k.Y) {
			return errors.New("an ECDSA key not on P-256: release keys are ECDSA P-256 or Ed25519")
		}
		return nil
	case *rsa.PublicKey:
		return errors.New("an RSA key: release keys are ECDSA P-256 or Ed25519")
	default:
		return fmt.Errorf("a %T key: release keys are ECDSA P-256 or Ed25519", key)
	}
}

// VerifySignature checks that src holds a signature of the image manifest digest by one of
// keys and says by which. src must be a TaggedSource (Registry and Layout are). Every document
// is bounded and checked before it is believed; a payload's bytes are verified against the keys,
// and only then parsed.
func VerifySignature(ctx context.Context, src Source, digest string, keys []crypto.PublicKey) (Verified, error) {
	if !ValidDigest(digest) {
		return Verified{}, fmt.Errorf("signature: %s is not a sha256 digest", quote(digest))
	}
	if len(keys) == 0 {
		return Verified{}, fmt.Errorf("signature of %s: no trusted keys to check it with", digest)
	}
	for i, k := range keys {
		if err := checkTrustedKey(k); err != nil {
			return Verified{}, fmt.Errorf("signature of %s: trusted key %d: %v", digest, i, err)
		}
	}
	tagged, ok := src.(TaggedSource)
	if !ok {
		return Verified{}, fmt.Errorf("signature of %s: this source cannot look up tags", digest)
	}
	tag := SignatureTag(digest)
	body, err := tagged.ManifestByTag(ctx, tag, MaxSignatureManifestBytes)
	if errors.Is(err, ErrNoTag) {
		return Verified{}, fmt.Errorf("no signature for %s: %w", digest, err)
	}
	if err != nil {
		return Verified{}, fmt.Errorf("signature of %s: %v", digest, err)
	}
	var m Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		return Verified{}, fmt.Errorf("malformed signature manifest for %s: not JSON: %v", digest, err)
	}
	if isLegacySignature(m) {
		signer, err := verifyLegacy(ctx, src, body, digest, keys)
		return Verified{Signer: signer, Legacy: err == nil}, err
	}
	layers, err := cosignLayers(m)
	if err != nil {
		return Verified{}, fmt.Errorf("malformed signature manifest for %s: %v", digest, err)
	}
	var errs []error
	for _, l := range layers {
		signer, err := verifyCosignLayer(ctx, src, l, digest, keys)
		if err == nil {
			return Verified{Signer: signer}, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 1 {
		return Verified{}, errs[0]
	}
	return Verified{}, fmt.Errorf("none of the %d signatures of %s holds; the first: %v", len(errs), digest, errs[0])
}

// cosignLayer is one signature of a signature manifest: its payload's descriptor and the
// decoded signature.
type cosignLayer struct {
	payload   Descriptor
	signature []byte
}

// cosignLayers checks a signature manifest's shape and returns its signatures, each bounded.
func cosignLayers(m Manifest) ([]cosignLayer, error) {
	switch {
	case m.SchemaVersion != 2:
		return nil, fmt.Errorf("schemaVersion is %d, want 2", m.SchemaVersion)
	case m.MediaType != MediaTypeManifest:
		return nil, fmt.Errorf("mediaType is %s, want %s", quote(m.MediaType), MediaTypeManifest)
	case len(m.Layers) > MaxSignatureLayers:
		return nil, fmt.Errorf("%d layers, more than the %d looked at", len(m.Layers), MaxSignatureLayers)
	}
	var out []cosignLayer
	for i, l := range m.Layers {
		if l.MediaType != MediaTypeSimpleSigning {
			continue
		}
		if err := checkDigestSize(l); err != nil {
			return nil, fmt.Errorf("layer %d: %v", i, err)
		}
		if l.Size == 0 || l.Size > MaxSignaturePayloadBytes {
			return nil, fmt.Errorf("layer %d: payload is %d bytes, want 1 to %d", i, l.Size, MaxSignaturePayloadBytes)
		}
		enc, ok := l.Annotations[AnnotationCosignSignature]
		if !ok {
			return nil, fmt.Errorf("layer %d has no %s annotation", i, AnnotationCosignSignature)
		}
		if len(enc) > MaxSignatureText {
			return nil, fmt.Errorf("layer %d: %s annotation is %d characters, more than %d", i, AnnotationCosignSignature, len(enc), MaxSignatureText)
		}
		sig, err := base64.StdEncoding.Strict().DecodeString(enc)
		if err != nil || len(sig) == 0 {
			return nil, fmt.Errorf("layer %d: %s annotation is not base64 of a signature", i, AnnotationCosignSignature)
		}
		out = append(out, cosignLayer{payload: l, signature: sig})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s layer", MediaTypeSimpleSigning)
	}
	return out, nil
}

// verifyCosignLayer checks one signature: it must hold for a trusted key over the payload's
// bytes, and the payload must be a cosign signature of digest. It returns the signer's
// fingerprint.
func verifyCosignLayer(ctx context.Context, src Source, l cosignLayer, digest string, keys []crypto.PublicKey) (string, error) {
	var p CosignPayload
	signer, err := signedPayload(ctx, src, l.payload, l.signature, digest, keys, &p)
	if err != nil {
		return "", err
	}
	if p.Critical.Identity.DockerReference == nil {
		return "", fmt.Errorf("malformed signature payload for %s: no critical.identity.docker-reference", digest)
	}
	if err := payloadNames(p.Critical.Image.DockerManifestDigest, digest); err != nil {
		return "", err
	}
	return signer, nil
}

// signedDocument is a signature format's payload, decoded from JSON; checkType says whether it
// is the type of document that format signs.
type signedDocument interface {
	checkType(digest string) error
}

func (p *CosignPayload) checkType(digest string) error {
	if p.Critical.Type != CosignSignatureType {
		return fmt.Errorf("signature payload for %s has type %s, not %s", digest, quote(p.Critical.Type), quote(CosignSignatureType))
	}
	return nil
}

// signedPayload fetches a signature's payload (layer), finds the trusted key for which sig
// holds over it, and decodes the payload into doc, which must be of its format's type. Both
// formats check their signatures so; it returns the signer's fingerprint.
func signedPayload(ctx context.Context, src Source, layer Descriptor, sig []byte, digest string, keys []crypto.PublicKey,
	doc signedDocument) (string, error) {
	payload, err := fetchPayload(ctx, src, layer)
	if err != nil {
		return "", fmt.Errorf("signature payload of %s: %v", digest, err)
	}
	signer, trusted := "", false
	for _, k := range keys {
		if signatureHolds(k, payload, sig) {
			signer, trusted = KeyFingerprint(k), true
			break
		}
	}
	if !trusted {
		return "", fmt.Errorf("signature of %s is not by a trusted key", digest)
	}
	if err := json.Unmarshal(payload, doc); err != nil {
		return "", fmt.Errorf("malformed signature payload for %s: %v", digest, err)
	}
	if err := doc.checkType(digest); err != nil {
		return "", err
	}
	return signer, nil
}

// payloadNames checks that the image a signature payload names, got, is digest.
func payloadNames(got, digest string) error {
	if got == digest {
		return nil
	}
	if !ValidDigest(got) {
		got = quote(got)
	}
	return fmt.Errorf("signature payload names %s, not the image %s", got, digest)
}

// signatureHolds verifies sig over payload with key: ECDSA over the payload's SHA-256 (ASN.1
// DER signature), Ed25519 over the payload itself. Keys were checked by checkTrustedKey.
func signatureHolds(key crypto.PublicKey, payload, sig []byte) bool {
	switch k := key.(type) {
	case ed25519.PublicKey:
		return len(sig) == ed25519.SignatureSize && ed25519.Verify(k, payload, sig)
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(payload)
		return ecdsa.VerifyASN1(k, sum[:], sig)
	}
	return false
}

// fetchPayload reads a signature payload blob, bounded by its descriptor (checked before) and
// verified against its digest.
func fetchPayload(ctx context.Context, src Source, d Descriptor) ([]byte, error) {
	rc, err := src.Blob(ctx, d)
	if err != nil {
		return nil, err
	}
	return readVerified(rc)
}

// ManifestByTag fetches /v2/<repo>/manifests/<tag> as an OCI image manifest, at most max
// bytes; a 404 is ErrNoTag (authorized, not get: get turns a 404 into an error like any other).
func (r *Registry) ManifestByTag(ctx context.Context, tag string, max int64) ([]byte, error) {
	if !tagPattern.MatchString(tag) {
		return nil, fmt.Errorf("tag %s is not [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", quote(tag))
	}
	u, err := r.endpoint("manifests/" + tag)
	if err != nil {
		return nil, err
	}
	resp, err := r.authorized(ctx, u, MediaTypeManifest)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusNotFound {
		drainClose(resp)
		return nil, &noTagError{where: "registry", tag: tag}
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, statusError(resp)
	}
	if resp.ContentLength > max {
		return nil, fmt.Errorf("manifest %s is %d bytes, more than the %d allowed", quote(tag), resp.ContentLength, max)
	}
	return readLimited(resp.Body, max, "manifest "+quote(tag))
}

// ManifestByTag reads the manifest blob that index.json names tag (its
// org.opencontainers.image.ref.name annotation), verified, at most max bytes.
func (l *Layout) ManifestByTag(ctx context.Context, tag string, max int64) ([]byte, error) {
	var found *Descriptor
	for i, d := range l.index.Manifests {
		if d.Annotations[AnnotationRefName] != tag {
			continue
		}
		if found != nil && found.Digest != d.Digest {
			return nil, fmt.Errorf("the layout's index.json names two manifests %s", quote(tag))
		}
		found = &l.index.Manifests[i]
	}
	if found == nil {
		return nil, &noTagError{where: "layout", tag: tag}
	}
	if found.Size > max {
		return nil, fmt.Errorf("manifest %s is %d bytes, more than the %d allowed", quote(tag), found.Size, max)
	}
	body, _, err := l.manifestFor(ctx, *found)
	return body, err
}
