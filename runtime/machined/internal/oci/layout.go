package oci

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

const (
	maxLayoutMembers = 1 << 16
	maxMemberName    = 4096
)

// Layout serves an OCI image layout from a tar file on local disk (the tarball `kiln image`
// writes: oci-layout, index.json and blobs/sha256/<hex>; anything else, such as Docker's
// manifest.json, is ignored). The tar is indexed once and blobs are read in place, never
// unpacked, so a hostile member name can do no harm beyond being refused.
type Layout struct {
	f       layoutFile
	size    int64
	members map[string]member
	index   Index
}

// layoutFile is where a layout's tar is read from: a local file, or a URL read by byte ranges.
type layoutFile interface {
	io.ReaderAt
	io.Closer
}

// rangeOpener streams a part of a layout's tar with one read (a remote tar's blob).
type rangeOpener interface {
	OpenRange(off, n int64) (io.ReadCloser, error)
}

type member struct{ off, size int64 }

// OpenLayoutTar opens and indexes the layout tarball at path. It refuses member names that are
// absolute or contain "..", duplicate names, links, devices and sparse files, a missing or
// unknown oci-layout, and an index.json over 4 MiB or with a malformed descriptor.
func OpenLayoutTar(path string) (*Layout, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	l := &Layout{f: f, size: st.Size(), members: map[string]member{}}
	if err := l.load(); err != nil {
		f.Close()
		return nil, fmt.Errorf("OCI layout %s: %w", path, err)
	}
	return l, nil
}

// Close closes the tar file; readers from Blob fail afterwards.
func (l *Layout) Close() error { return l.f.Close() }

// Index returns the entries of the layout's index.json.
func (l *Layout) Index() []Descriptor {
	return append([]Descriptor(nil), l.index.Manifests...)
}

func (l *Layout) load() error {
	sr := io.NewSectionReader(l.f, 0, l.size)
	tr := tar.NewReader(sr)
	for n := 0; ; n++ {
		if n >= maxLayoutMembers {
			return fmt.Errorf("more than %d tar members", maxLayoutMembers)
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("reading tar: %w", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := layoutName(hdr.Name)
		if err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			continue
		case tar.TypeReg:
		default:
			return fmt.Errorf("member %s: type %q is not allowed in a layout (regular files and directories only)", quote(hdr.Name), hdr.Typeflag)
		}
		for k := range hdr.PAXRecords {
			if strings.HasPrefix(k, "GNU.sparse.") {
				return fmt.Errorf("member %s is a sparse file", quote(hdr.Name))
			}
		}
		if _, dup := l.members[name]; dup {
			return fmt.Errorf("member %s appears twice", quote(name))
		}
		off, err := sr.Seek(0, io.SeekCurrent)
		if err != nil {
			return err
		}
		if hdr.Size > l.size-off {
			return fmt.Errorf("member %s: the tar is truncated", quote(name))
		}
		l.members[name] = member{off: off, size: hdr.Size}
	}
	version, err := l.readMember("oci-layout", 4<<10)
	if err != nil {
		return err
	}
	var v struct {
		ImageLayoutVersion string `json:"imageLayoutVersion"`
	}
	if err := json.Unmarshal(version, &v); err != nil || v.ImageLayoutVersion != "1.0.0" {
		return errors.New(`oci-layout is not {"imageLayoutVersion": "1.0.0"}`)
	}
	index, err := l.readMember("index.json", maxManifestBytes)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(index, &l.index); err != nil {
		return fmt.Errorf("index.json: %v", err)
	}
	if l.index.SchemaVersion != 2 {
		return fmt.Errorf("index.json: schemaVersion is %d, want 2", l.index.SchemaVersion)
	}
	if mt := l.index.MediaType; mt != "" && mt != MediaTypeIndex {
		return fmt.Errorf("index.json: mediaType is %s", quote(mt))
	}
	for i, d := range l.index.Manifests {
		if err := checkDescriptor(d); err != nil {
			return fmt.Errorf("index.json: manifest %d: %w", i, err)
		}
	}
	return nil
}

// layoutName normalises a member name ("./" prefix and trailing "/" dropped) and refuses any
// that is absolute, not clean, or has a ".." component.
func layoutName(name string) (string, error) {
	n := strings.TrimSuffix(strings.TrimPrefix(name, "./"), "/")
	switch {
	case len(name) > maxMemberName:
		return "", fmt.Errorf("member name %s is too long", quote(name))
	case strings.ContainsRune(name, 0):
		return "", fmt.Errorf("member name %s holds a NUL", quote(name))
	case strings.HasPrefix(n, "/"):
		return "", fmt.Errorf("member name %s is absolute", quote(name))
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", fmt.Errorf("member name %s escapes the layout", quote(name))
		}
	}
	if n == "" || n == "." {
		return ".", nil
	}
	if path.Clean(n) != n {
		return "", fmt.Errorf("member name %s is not clean", quote(name))
	}
	return n, nil
}

// readMember reads a small member whole.
func (l *Layout) readMember(name string, max int64) ([]byte, error) {
	m, ok := l.members[name]
	if !ok {
		return nil, fmt.Errorf("no %s", name)
	}
	if m.size > max {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d allowed", name, m.size, max)
	}
	b := make([]byte, m.size)
	if _, err := l.f.ReadAt(b, m.off); err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	return b, nil
}

// Blob streams blobs/sha256/<hex>, verified against desc.
func (l *Layout) Blob(ctx context.Context, desc Descriptor) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := checkDigestSize(desc); err != nil {
		return nil, err
	}
	m, ok := l.members["blobs/sha256/"+desc.Digest[len(sha256Prefix):]]
	if !ok {
		return nil, fmt.Errorf("blob %s is not in the layout", desc.Digest)
	}
	if m.size != desc.Size {
		return nil, fmt.Errorf("blob %s is %d bytes in the layout, its descriptor says %d", desc.Digest, m.size, desc.Size)
	}
	if ro, ok := l.f.(rangeOpener); ok {
		rc, err := ro.OpenRange(m.off, m.size)
		if err != nil {
			return nil, fmt.Errorf("blob %s: %w", desc.Digest, err)
		}
		return newVerifier(rc, desc), nil
	}
	return newVerifier(io.NewSectionReader(l.f, m.off, m.size), desc), nil
}

// Resolve finds the image ref names in index.json: "" for the only entry, a digest, or the
// value of an org.opencontainers.image.ref.name annotation. When several entries qualify, the
// one whose platform matches is taken. A digest that index.json does not list may still name a
// manifest blob in the layout (one reached through a nested index).
func (l *Layout) Resolve(ctx context.Context, ref string, platform Platform) (Image, error) {
	var candidates []Descriptor
	for _, d := range l.index.Manifests {
		if ref == "" || d.Digest == ref || (!ValidDigest(ref) && d.Annotations[AnnotationRefName] == ref) {
			candidates = append(candidates, d)
		}
	}
	if len(candidates) == 0 && ValidDigest(ref) {
		if m, ok := l.members["blobs/sha256/"+ref[len(sha256Prefix):]]; ok {
			candidates = append(candidates, Descriptor{Digest: ref, Size: m.size})
		}
	}
	if len(candidates) > 1 {
		var matching []Descriptor
		for _, d := range candidates {
			if d.Platform != nil && platformMatches(*d.Platform, platform) {
				matching = append(matching, d)
			}
		}
		candidates = matching
	}
	switch {
	case len(candidates) == 0 && ref == "":
		return Image{}, errors.New("the layout's index.json has no image for this platform")
	case len(candidates) == 0:
		return Image{}, fmt.Errorf("the layout has no image %s (it has: %s)", quote(ref), orNone(l.names()))
	case len(candidates) > 1:
		return Image{}, fmt.Errorf("the layout has %d images for %s/%s: name one (%s)", len(candidates), platform.OS, platform.Architecture, orNone(l.names()))
	}
	d := candidates[0]
	body, mediaType, err := l.manifestFor(ctx, d)
	if err != nil {
		return Image{}, err
	}
	img, err := resolveImage(ctx, l, body, mediaType, platform, l.manifestFor)
	if err != nil {
		return Image{}, fmt.Errorf("layout image %s: %w", d.Digest, err)
	}
	return img, nil
}

// manifestFor reads a manifest or index blob, verified, at most 4 MiB.
func (l *Layout) manifestFor(ctx context.Context, d Descriptor) ([]byte, string, error) {
	if d.Size > maxManifestBytes {
		return nil, "", fmt.Errorf("manifest %s is %d bytes, more than the %d allowed", d.Digest, d.Size, maxManifestBytes)
	}
	rc, err := l.Blob(ctx, d)
	if err != nil {
		return nil, "", err
	}
	body, err := readVerified(rc)
	if err != nil {
		return nil, "", err
	}
	return body, d.MediaType, nil
}

// names lists index.json's ref.name annotations (or digests) for error messages.
func (l *Layout) names() []string {
	var out []string
	for _, d := range l.index.Manifests {
		if len(out) == 10 {
			out = append(out, "...")
			break
		}
		if n := d.Annotations[AnnotationRefName]; n != "" {
			out = append(out, quote(n))
		} else {
			out = append(out, d.Digest)
		}
	}
	return out
}
