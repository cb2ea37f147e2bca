package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"
)

// What follows is shared by Registry and Layout: from a verified top-level document (an index
// or a manifest) to an Image.

type docKind int

const (
	kindIndex docKind = iota + 1
	kindManifest
)

// fetchFunc returns the bytes of the manifest d points at, verified against d's digest and
// size, and the media type its source reports ("" when none).
type fetchFunc func(ctx context.Context, d Descriptor) (body []byte, mediaType string, err error)

var errSchema1 = errors.New("Docker schema1 manifests are not supported (push the image again with a current tool)")

// classify tells an index from a manifest. The body's own mediaType wins over the transport's
// Content-Type, since only the body is covered by the digest; a document with neither is
// recognised by its fields.
func classify(body []byte, contentType string) (docKind, error) {
	var p struct {
		SchemaVersion int             `json:"schemaVersion"`
		MediaType     string          `json:"mediaType"`
		Manifests     json.RawMessage `json:"manifests"`
		Config        json.RawMessage `json:"config"`
		FSLayers      json.RawMessage `json:"fsLayers"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return 0, fmt.Errorf("manifest is not a JSON object: %w", err)
	}
	if p.SchemaVersion == 1 || p.FSLayers != nil {
		return 0, errSchema1
	}
	mt := p.MediaType
	if mt == "" {
		mt, _, _ = mime.ParseMediaType(contentType)
	}
	var kind docKind
	switch mt {
	case MediaTypeIndex, MediaTypeDockerList:
		kind = kindIndex
	case MediaTypeManifest, MediaTypeDockerManifest:
		kind = kindManifest
	case mediaTypeSchema1, mediaTypeSchema1Signed:
		return 0, errSchema1
	case "", "application/json", "application/octet-stream", "text/plain":
		switch {
		case p.Manifests != nil && p.Config == nil:
			kind = kindIndex
		case p.Config != nil && p.Manifests == nil:
			kind = kindManifest
		default:
			return 0, errors.New("document is neither an image index nor an image manifest")
		}
	default:
		return 0, fmt.Errorf("unsupported manifest media type %s", quote(mt))
	}
	if p.SchemaVersion != 2 {
		return 0, fmt.Errorf("manifest schemaVersion is %d, want 2", p.SchemaVersion)
	}
	return kind, nil
}

// resolveImage follows body (already verified by the caller) through an index, when it is one,
// to the manifest for platform, and fetches and verifies that manifest's config.
func resolveImage(ctx context.Context, blobs Source, body []byte, contentType string, platform Platform, fetch fetchFunc) (Image, error) {
	kind, err := classify(body, contentType)
	if err != nil {
		return Image{}, err
	}
	if kind == kindIndex {
		var idx Index
		if err := json.Unmarshal(body, &idx); err != nil {
			return Image{}, fmt.Errorf("image index: %w", err)
		}
		d, err := pickPlatform(idx, platform)
		if err != nil {
			return Image{}, err
		}
		if body, contentType, err = fetch(ctx, d); err != nil {
			return Image{}, err
		}
		if kind, err = classify(body, contentType); err != nil {
			return Image{}, fmt.Errorf("manifest %s: %w", d.Digest, err)
		}
		if kind != kindManifest {
			return Image{}, fmt.Errorf("index entry %s for %s/%s is not an image manifest", d.Digest, platform.OS, platform.Architecture)
		}
	}
	digest := digestOf(body)
	var m Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		return Image{}, fmt.Errorf("manifest %s: %w", digest, err)
	}
	if err := checkManifest(m); err != nil {
		return Image{}, fmt.Errorf("manifest %s: %w", digest, err)
	}
	cfg, err := fetchConfig(ctx, blobs, m.Config)
	if err != nil {
		return Image{}, fmt.Errorf("manifest %s: config: %w", digest, err)
	}
	return Image{Digest: digest, Manifest: m, Config: cfg}, nil
}

// pickPlatform returns the first image manifest in idx for platform's os and architecture
// (and variant, when both sides name one).
func pickPlatform(idx Index, platform Platform) (Descriptor, error) {
	if platform.OS == "" || platform.Architecture == "" {
		return Descriptor{}, errors.New("an image index needs a platform (os and architecture) to choose from")
	}
	var seen []string
	for _, d := range idx.Manifests {
		if err := checkDescriptor(d); err != nil {
			return Descriptor{}, fmt.Errorf("image index: %w", err)
		}
		if d.MediaType != MediaTypeManifest && d.MediaType != MediaTypeDockerManifest {
			continue // nested indexes, attestations and the like
		}
		if d.Platform == nil {
			continue
		}
		if len(seen) < 16 {
			seen = append(seen, quote(d.Platform.OS+"/"+d.Platform.Architecture))
		}
		if platformMatches(*d.Platform, platform) {
			return d, nil
		}
	}
	return Descriptor{}, fmt.Errorf("image index has no manifest for %s/%s (it has: %s)", platform.OS, platform.Architecture, orNone(seen))
}

func platformMatches(have, want Platform) bool {
	return have.OS == want.OS && have.Architecture == want.Architecture &&
		(want.Variant == "" || have.Variant == "" || have.Variant == want.Variant)
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func checkManifest(m Manifest) error {
	if m.SchemaVersion != 2 {
		return fmt.Errorf("schemaVersion is %d, want 2", m.SchemaVersion)
	}
	if err := checkDescriptor(m.Config); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if m.Config.Size > maxConfigBytes {
		return fmt.Errorf("config is %d bytes, more than the %d allowed", m.Config.Size, maxConfigBytes)
	}
	for i, l := range m.Layers {
		if err := checkDescriptor(l); err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return nil
}

// fetchConfig reads the config blob through the source's verifying reader.
func fetchConfig(ctx context.Context, blobs Source, d Descriptor) (ImageConfig, error) {
	rc, err := blobs.Blob(ctx, d)
	if err != nil {
		return ImageConfig{}, err
	}
	b, err := readVerified(rc)
	if err != nil {
		return ImageConfig{}, err
	}
	var cfg ImageConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return ImageConfig{}, fmt.Errorf("%s is not an image config: %w", d.Digest, err)
	}
	return cfg, nil
}

// checkFetched checks a manifest fetched for descriptor d: its size first (cheap, and what
// bounded the read), then its digest.
func checkFetched(body []byte, d Descriptor) error {
	if int64(len(body)) != d.Size {
		return fmt.Errorf("manifest %s is %d bytes, its descriptor says %d", d.Digest, len(body), d.Size)
	}
	if got := digestOf(body); got != d.Digest {
		return fmt.Errorf("manifest %s hashes to %s", d.Digest, got)
	}
	return nil
}
