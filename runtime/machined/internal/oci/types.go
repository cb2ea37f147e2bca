package oci

import (
	"context"
	"io"
)

// Media types machined understands. Docker's schema2 types are accepted because registries
// and tools still produce them; Docker schema1 (signed, no digests for configs) is refused.
const (
	MediaTypeIndex          = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest       = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig         = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer          = "application/vnd.oci.image.layer.v1.tar"
	MediaTypeLayerGzip      = "application/vnd.oci.image.layer.v1.tar+gzip"
	MediaTypeDockerList     = "application/vnd.docker.distribution.manifest.list.v2+json"
	MediaTypeDockerManifest = "application/vnd.docker.distribution.manifest.v2+json"
	MediaTypeDockerLayer    = "application/vnd.docker.image.rootfs.diff.tar.gzip"

	mediaTypeSchema1       = "application/vnd.docker.distribution.manifest.v1+json"
	mediaTypeSchema1Signed = "application/vnd.docker.distribution.manifest.v1+prettyjws"
)

// AnnotationRefName names an image in an OCI layout's index.json.
const AnnotationRefName = "org.opencontainers.image.ref.name"

// Size bounds for the JSON documents read whole into memory.
const (
	maxManifestBytes = 4 << 20
	maxConfigBytes   = 1 << 20
)

// Descriptor points at a blob by digest and size (OCI image spec, descriptor.md).
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

// Platform is the os/architecture an image index entry is for.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

// Index is an OCI image index (or Docker manifest list): one manifest per platform.
type Index struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType,omitempty"`
	Manifests     []Descriptor      `json:"manifests"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// Manifest is an OCI image manifest (or Docker schema2 manifest).
type Manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType,omitempty"`
	Config        Descriptor        `json:"config"`
	Layers        []Descriptor      `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// LayersByRole returns the layers whose dev.kiln.layer annotation is role ("boot", "disk" or
// "installer"): an upgrade needs only some of them.
func (m Manifest) LayersByRole(role string) []Descriptor {
	var out []Descriptor
	for _, l := range m.Layers {
		if l.Annotations[AnnotationLayer] == role {
			out = append(out, l)
		}
	}
	return out
}

// ImageConfig is the part of an OCI image config machined reads.
type ImageConfig struct {
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Variant      string          `json:"variant,omitempty"`
	Config       ContainerConfig `json:"config"`
}

// ContainerConfig is the image config's "config" object (field names as the spec spells them).
type ContainerConfig struct {
	Labels     map[string]string `json:"Labels,omitempty"`
	Entrypoint []string          `json:"Entrypoint,omitempty"`
}

// Image is a resolved image manifest: its digest (sha256 of the exact manifest bytes), the
// manifest, and the parsed config.
type Image struct {
	Digest   string
	Manifest Manifest
	Config   ImageConfig
}

// Source is where an image comes from; both implementations verify what they return.
type Source interface {
	// Resolve returns the image for ref (a tag or digest for a registry; for a layout, ""
	// means the only image, else a ref.name annotation or a digest), following an image index
	// to the manifest for platform. When ref names a digest, the manifest (or the index it
	// came through) must hash to it.
	Resolve(ctx context.Context, ref string, platform Platform) (Image, error)
	// Blob streams a blob. The reader returns an error (never io.EOF) at its end if the bytes
	// read do not match desc.Digest and desc.Size, and errors as soon as more than desc.Size
	// bytes arrive.
	Blob(ctx context.Context, desc Descriptor) (io.ReadCloser, error)
}

var (
	_ Source = (*Registry)(nil)
	_ Source = (*Layout)(nil)
)
