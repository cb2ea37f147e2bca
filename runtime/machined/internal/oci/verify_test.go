package oci

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestValidDigest(t *testing.T) {
	for d, want := range map[string]bool{
		"sha256:" + hexA:                     true,
		"sha256:" + hexA[:63]:                false,
		"sha256:" + hexA + "a":               false,
		"sha256:" + strings.ToUpper(hexA):    false,
		"sha512:" + hexA:                     false,
		"sha256:" + hexA[:63] + "g":          false,
		"sha256:../../../../etc/passwd" + "": false,
		"":                                   false,
	} {
		if ValidDigest(d) != want {
			t.Errorf("ValidDigest(%q) = %v", d, !want)
		}
	}
}

func TestVerifierExact(t *testing.T) {
	b := []byte("hello, blob")
	got, err := io.ReadAll(newVerifier(iotest.OneByteReader(bytes.NewReader(b)), descOf("x", b)))
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("got %q, %v", got, err)
	}
	// An empty blob is a blob too.
	if _, err := io.ReadAll(newVerifier(bytes.NewReader(nil), descOf("x", nil))); err != nil {
		t.Fatal(err)
	}
}

func TestVerifierMismatch(t *testing.T) {
	b := []byte("hello, blob")
	d := descOf("x", b)
	_, err := io.ReadAll(newVerifier(bytes.NewReader([]byte("HELLO, blob")), d))
	wantErr(t, err, "digest mismatch")
	wantErr(t, err, d.Digest)
}

func TestVerifierShort(t *testing.T) {
	b := []byte("hello, blob")
	_, err := io.ReadAll(newVerifier(bytes.NewReader(b[:5]), descOf("x", b)))
	wantErr(t, err, "got 5 bytes, its descriptor says 11")
}

// An overlong blob fails as soon as the extra byte arrives, not at the end of the stream.
func TestVerifierLongFailsAtOnce(t *testing.T) {
	b := []byte("0123456789")
	d := descOf("x", b)
	endless := io.MultiReader(bytes.NewReader(b), neverEnding('x'))
	v := newVerifier(endless, d)
	n, err := io.Copy(io.Discard, v)
	wantErr(t, err, "more than the 10 bytes")
	if n != 10 {
		t.Fatalf("passed on %d bytes", n)
	}
	// The error sticks.
	if _, err2 := v.Read(make([]byte, 4)); err2 == nil {
		t.Fatal("read after error succeeded")
	}
}

type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

func TestVerifierPassesErrors(t *testing.T) {
	boom := errors.New("boom")
	_, err := io.ReadAll(newVerifier(iotest.ErrReader(boom), descOf("x", []byte("abc"))))
	if !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
}
