package oci

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"

	"kiln/machined/internal/safefile"
)

const sha256Prefix = "sha256:"

// ValidDigest reports whether d is "sha256:" and 64 lowercase hex digits, the only form
// machined accepts: anything else could not be verified, or could smuggle path or URL syntax.
func ValidDigest(d string) bool {
	if len(d) != len(sha256Prefix)+64 || !strings.HasPrefix(d, sha256Prefix) {
		return false
	}
	for _, c := range d[len(sha256Prefix):] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// digestOf is the sha256 digest of b in descriptor form.
func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return sha256Prefix + hex.EncodeToString(sum[:])
}

// checkDigestSize is what fetching a blob needs of a descriptor.
func checkDigestSize(d Descriptor) error {
	if !ValidDigest(d.Digest) {
		return fmt.Errorf("descriptor digest %s is not sha256:<64 lowercase hex digits>", quote(d.Digest))
	}
	if d.Size < 0 {
		return fmt.Errorf("descriptor %s has negative size %d", d.Digest, d.Size)
	}
	return nil
}

// checkDescriptor is what a descriptor inside a manifest or index must be.
func checkDescriptor(d Descriptor) error {
	if err := checkDigestSize(d); err != nil {
		return err
	}
	if d.MediaType == "" {
		return fmt.Errorf("descriptor %s has no mediaType", d.Digest)
	}
	return nil
}

// verifier hashes and counts a blob as it streams, so a caller that unpacks as it reads still
// learns at the end whether it got the blob the descriptor promised; it asks for at most one
// byte more than the descriptor's size, so an overlong blob fails at once instead of after
// filling a disk.
type verifier struct {
	r    io.Reader
	c    io.Closer
	desc Descriptor
	h    hash.Hash
	n    int64
	err  error
}

// newVerifier wraps r (closed by Close when it is an io.Closer). desc must have passed
// checkDigestSize.
func newVerifier(r io.Reader, desc Descriptor) io.ReadCloser {
	v := &verifier{r: r, desc: desc, h: sha256.New()}
	if c, ok := r.(io.Closer); ok {
		v.c = c
	}
	return v
}

func (v *verifier) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if room := v.desc.Size - v.n + 1; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := v.r.Read(p)
	if n < 0 || n > len(p) {
		v.err = fmt.Errorf("blob %s: reader returned a bad count %d", v.desc.Digest, n)
		return 0, v.err
	}
	if v.n+int64(n) > v.desc.Size {
		keep := int(v.desc.Size - v.n)
		v.h.Write(p[:keep])
		v.n += int64(keep)
		v.err = fmt.Errorf("blob %s: more than the %d bytes its descriptor says", v.desc.Digest, v.desc.Size)
		return keep, v.err
	}
	v.h.Write(p[:n])
	v.n += int64(n)
	switch {
	case err == io.EOF:
		v.err = v.check()
		return n, v.err
	case err != nil:
		v.err = fmt.Errorf("blob %s: %w", v.desc.Digest, err)
		return n, v.err
	}
	return n, nil
}

// check runs at the end of the stream: io.EOF only for the exact bytes.
func (v *verifier) check() error {
	if v.n != v.desc.Size {
		return fmt.Errorf("blob %s: got %d bytes, its descriptor says %d", v.desc.Digest, v.n, v.desc.Size)
	}
	if got := sha256Prefix + hex.EncodeToString(v.h.Sum(nil)); got != v.desc.Digest {
		return fmt.Errorf("blob %s: digest mismatch: the bytes hash to %s", v.desc.Digest, got)
	}
	return io.EOF
}

func (v *verifier) Close() error {
	if v.err == nil {
		v.err = errors.New("blob reader closed")
	}
	if v.c != nil {
		return v.c.Close()
	}
	return nil
}

// readVerified reads a whole blob from a verifier (which bounds it to its descriptor's size).
func readVerified(rc io.ReadCloser) ([]byte, error) {
	defer rc.Close()
	return io.ReadAll(rc)
}

// readLimited reads all of r, failing if it holds more than max bytes.
func readLimited(r io.Reader, max int64, what string) ([]byte, error) {
	b, err := safefile.ReadAtMost(r, max)
	if errors.Is(err, safefile.ErrTooLarge) {
		return nil, fmt.Errorf("%s is larger than %d bytes", what, max)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	return b, nil
}

// quote prints a hostile string safely in an error: Go-quoted and cut short.
func quote(s string) string {
	const max = 200
	if len(s) > max {
		return strconv.Quote(s[:max]) + "..."
	}
	return strconv.Quote(s)
}
