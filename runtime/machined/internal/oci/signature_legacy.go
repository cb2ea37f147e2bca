package oci

// The first Kiln signature format, accepted until Kiln LegacySignatureUntil so that images signed
// before the cosign format (and the release `kiln release push --sign KEYDIR --signature-format
// kiln-v1` signs for machines that know only this format) still install. Same tag as cosign's;
// an OCI image manifest whose config is the empty descriptor, whose one layer is the payload
// (media type MediaTypeSignature, at most MaxSignaturePayloadBytes, the Ed25519 signature over
// its bytes in base64 in the layer's dev.kiln.signature annotation), and whose
// dev.kiln.signed-digest annotation is the signed digest D. The payload is canonical JSON:
//
//	{"critical":{"image":{"manifest-digest":"<D>"},"type":"dev.kiln.installer-signature.v1"}}

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
)

// The first format's names, and the release of Kiln whose machined no longer accepts it.
const (
	MediaTypeEmpty         = "application/vnd.oci.empty.v1+json"
	EmptyDigest            = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" // of "{}"
	MediaTypeSignature     = "application/vnd.dev.kiln.signature.v1+json"
	AnnotationSignature    = "dev.kiln.signature"     // on the layer: base64 of the Ed25519 signature
	AnnotationSignedDigest = "dev.kiln.signed-digest" // on the manifest: the digest it signs
	SignatureType          = "dev.kiln.installer-signature.v1"
	LegacySignatureUntil   = "0.3.0"
)

// SignaturePayload is the first format's signed document.
type SignaturePayload struct {
	Critical struct {
		Image struct {
			ManifestDigest string `json:"manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
}

func (p *SignaturePayload) checkType(digest string) error {
	if p.Critical.Type != SignatureType {
		return fmt.Errorf("signature payload for %s has type %s, not %s", digest, quote(p.Critical.Type), SignatureType)
	}
	return nil
}

// isLegacySignature: a signature manifest in the first Kiln format has a layer of its media type.
func isLegacySignature(m Manifest) bool {
	for _, l := range m.Layers {
		if l.MediaType == MediaTypeSignature {
			return true
		}
	}
	return false
}

// verifyLegacy checks a first-format signature manifest (body) of digest with the Ed25519 keys
// among keys and returns the signer's fingerprint.
func verifyLegacy(ctx context.Context, src Source, body []byte, digest string, keys []crypto.PublicKey) (string, error) {
	var edKeys []crypto.PublicKey
	for _, k := range keys {
		if _, ok := k.(ed25519.PublicKey); ok {
			edKeys = append(edKeys, k)
		}
	}
	if len(edKeys) == 0 {
		return "", fmt.Errorf("signature of %s is in the first Kiln format, which only an Ed25519 release key (release.pub) in release_keys checks; re-sign the image with kiln release push --sign KEYDIR", digest)
	}
	layer, sig, err := parseSignatureManifest(body, digest)
	if err != nil {
		return "", fmt.Errorf("malformed signature manifest for %s: %v", digest, err)
	}
	var p SignaturePayload
	signer, err := signedPayload(ctx, src, layer, sig, digest, edKeys, &p)
	if err != nil {
		return "", err
	}
	if err := payloadNames(p.Critical.Image.ManifestDigest, digest); err != nil {
		return "", err
	}
	return signer, nil
}

// parseSignatureManifest checks a first-format signature manifest's shape and returns its
// payload descriptor and the decoded signature.
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
