package oci

// Installer signatures, as `kiln release push --sign KEYDIR` writes them. The signed thing is an
// image manifest digest D (for a multi-arch release, each platform's manifest is signed on its
// own). In the same repository the tag sha256-<hex of D>.sig names an OCI image manifest whose
// config is the empty descriptor, whose one layer is the payload (media type
// MediaTypeSignature, at most 4 KiB, the Ed25519 signature over its bytes in base64 in the
// layer's dev.kiln.signature annotation), and whose dev.kiln.signed-digest annotation is D.
// The payload is canonical JSON:
//
//	{"critical":{"image":{"manifest-digest":"<D>"},"type":"dev.kiln.installer-signature.v1"}}

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
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
	MediaTypeEmpty         = "application/vnd.oci.empty.v1+json"
	EmptyDigest            = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" // of "{}"
	MediaTypeSignature     = "application/vnd.dev.kiln.signature.v1+json"
	AnnotationSignature    = "dev.kiln.signature"     // on the layer: base64 of the Ed25519 signature
	AnnotationSignedDigest = "dev.kiln.signed-digest" // on the manifest: the digest it signs
	SignatureType          = "dev.kiln.installer-signature.v1"

	MaxSignatureManifestBytes = 64 << 10
	MaxSignaturePayloadBytes  = 4 << 10
	MaxTrustedKeys            = 16
)

// SignaturePayload is the signed document.
type SignaturePayload struct {
	Critical struct {
		Image struct {
			ManifestDigest string `json:"manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
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

// KeyFingerprint names a public key: the first 16 hex digits of the sha256 of its 32 bytes
// (what `kiln release push --sign` prints).
func KeyFingerprint(key ed25519.PublicKey) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:])[:16]
}

// ParsePublicKeyPEM reads one PEM "PUBLIC KEY" block (PKIX) holding an Ed25519 key, and
// nothing else.
func ParsePublicKeyPEM(text string) (ed25519.PublicKey, error) {
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
	switch k := key.(type) {
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("Ed25519 key is %d bytes, want %d", len(k), ed25519.PublicKeySize)
		}
		return k, nil
	case *rsa.PublicKey:
		return nil, errors.New("an RSA key: release keys are Ed25519")
	case *ecdsa.PublicKey:
		return nil, errors.New("an ECDSA key: release keys are Ed25519")
	default:
		return nil, fmt.Errorf("a %T key: release keys are Ed25519", key)
	}
}

// VerifySignature checks that src holds a signature of the image manifest digest by one of
// keys, and returns that key's fingerprint. src must be a TaggedSource (Registry and Layout
// are). Every document is bounded and checked before it is believed; the payload's bytes are
// verified against each key, and only then parsed.
func VerifySignature(ctx context.Context, src Source, digest string, keys []ed25519.PublicKey) (string, error) {
	if !ValidDigest(digest) {
		return "", fmt.Errorf("signature: %s is not a sha256 digest", quote(digest))
	}
	if len(keys) == 0 {
		return "", fmt.Errorf("signature of %s: no trusted keys to check it with", digest)
	}
	for i, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return "", fmt.Errorf("signature of %s: trusted key %d is %d bytes, not an Ed25519 public key", digest, i, len(k))
		}
	}
	tagged, ok := src.(TaggedSource)
	if !ok {
		return "", fmt.Errorf("signature of %s: this source cannot look up tags", digest)
	}
	tag := SignatureTag(digest)
	body, err := tagged.ManifestByTag(ctx, tag, MaxSignatureManifestBytes)
	if errors.Is(err, ErrNoTag) {
		return "", fmt.Errorf("no signature for %s: %w", digest, err)
	}
	if err != nil {
		return "", fmt.Errorf("signature of %s: %v", digest, err)
	}
	layer, sig, err := parseSignatureManifest(body, digest)
	if err != nil {
		return "", fmt.Errorf("malformed signature manifest for %s: %v", digest, err)
	}
	rc, err := src.Blob(ctx, layer)
	if err != nil {
		return "", fmt.Errorf("signature payload of %s: %v", digest, err)
	}
	payload, err := readVerified(rc)
	if err != nil {
		return "", fmt.Errorf("signature payload of %s: %v", digest, err)
	}
	signer := ""
	for _, k := range keys {
		if ed25519.Verify(k, payload, sig) {
			signer = KeyFingerprint(k)
			break
		}
	}
	if signer == "" {
		return "", fmt.Errorf("signature of %s is not by a trusted key", digest)
	}
	var p SignaturePayload
	if err := json.Unmarshal(payload, &p); err != nil {
		return "", fmt.Errorf("malformed signature payload for %s: %v", digest, err)
	}
	if p.Critical.Type != SignatureType {
		return "", fmt.Errorf("signature payload for %s has type %s, not %s", digest, quote(p.Critical.Type), SignatureType)
	}
	if got := p.Critical.Image.ManifestDigest; got != digest {
		if !ValidDigest(got) {
			got = quote(got)
		}
		return "", fmt.Errorf("signature payload names %s, not the image %s", got, digest)
	}
	return signer, nil
}

// parseSignatureManifest checks a signature manifest's shape and returns its payload
// descriptor and the decoded signature.
func parseSignatureManifest(body []byte, digest string) (Descriptor, []byte, error) {
	var m Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		return Descriptor{}, nil, fmt.Errorf("not JSON: %v", err)
	}
	switch {
	case m.SchemaVersion != 2:
		return Descriptor{}, nil, fmt.Errorf("schemaVersion is %d, want 2", m.SchemaVersion)
	case m.MediaType != MediaTypeManifest:
		return Descriptor{}, nil, fmt.Errorf("mediaType is %s, want %s", quote(m.MediaType), MediaTypeManifest)
	case m.Config.MediaType != MediaTypeEmpty || m.Config.Digest != EmptyDigest || m.Config.Size != 2:
		return Descriptor{}, nil, fmt.Errorf("config is not the empty descriptor (%s, %s, 2 bytes)", MediaTypeEmpty, EmptyDigest)
	case len(m.Layers) != 1:
		return Descriptor{}, nil, fmt.Errorf("%d layers, want exactly one", len(m.Layers))
	case m.Annotations[AnnotationSignedDigest] != digest:
		return Descriptor{}, nil, fmt.Errorf("its %s annotation is %s", AnnotationSignedDigest, quote(m.Annotations[AnnotationSignedDigest]))
	}
	l := m.Layers[0]
	if l.MediaType != MediaTypeSignature {
		return Descriptor{}, nil, fmt.Errorf("layer media type is %s, want %s", quote(l.MediaType), MediaTypeSignature)
	}
	if err := checkDigestSize(l); err != nil {
		return Descriptor{}, nil, fmt.Errorf("layer: %v", err)
	}
	if l.Size == 0 || l.Size > MaxSignaturePayloadBytes {
		return Descriptor{}, nil, fmt.Errorf("payload is %d bytes, want 1 to %d", l.Size, MaxSignaturePayloadBytes)
	}
	enc, ok := l.Annotations[AnnotationSignature]
	if !ok {
		return Descriptor{}, nil, fmt.Errorf("layer has no %s annotation", AnnotationSignature)
	}
	if len(enc) > 2*base64.StdEncoding.EncodedLen(ed25519.SignatureSize) {
		return Descriptor{}, nil, fmt.Errorf("%s annotation is %d characters, too long for an Ed25519 signature", AnnotationSignature, len(enc))
	}
	sig, err := base64.StdEncoding.Strict().DecodeString(enc)
	if err != nil {
		return Descriptor{}, nil, fmt.Errorf("%s annotation is not base64: %v", AnnotationSignature, err)
	}
	if len(sig) != ed25519.SignatureSize {
		return Descriptor{}, nil, fmt.Errorf("%s annotation holds %d bytes, an Ed25519 signature is %d", AnnotationSignature, len(sig), ed25519.SignatureSize)
	}
	return l, sig, nil
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
