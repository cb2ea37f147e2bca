package oci

import (
	"strings"
	"testing"
)

const hexA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

func TestParseReferenceGood(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Reference
		str  string
	}{
		{"ghcr.io/kiln/installer", Reference{Host: "ghcr.io", Repo: "kiln/installer", Tag: "latest"}, "ghcr.io/kiln/installer:latest"},
		{"ghcr.io/kiln/installer:1.2.0", Reference{Host: "ghcr.io", Repo: "kiln/installer", Tag: "1.2.0"}, ""},
		{"localhost/x:v1", Reference{Host: "localhost", Repo: "x", Tag: "v1"}, ""},
		{"localhost:5000/a/b/c:tag_1.x-y", Reference{Host: "localhost:5000", Repo: "a/b/c", Tag: "tag_1.x-y"}, ""},
		{"10.0.0.1:443/repo", Reference{Host: "10.0.0.1:443", Repo: "repo", Tag: "latest"}, "10.0.0.1:443/repo:latest"},
		{"[::1]:5000/repo:t", Reference{Host: "[::1]:5000", Repo: "repo", Tag: "t"}, ""},
		{"reg.example/kiln/installer@sha256:" + hexA, Reference{Host: "reg.example", Repo: "kiln/installer", Digest: "sha256:" + hexA}, ""},
		{"reg.example/kiln/installer:1.0@sha256:" + hexA, Reference{Host: "reg.example", Repo: "kiln/installer", Tag: "1.0", Digest: "sha256:" + hexA}, ""},
		{"reg.example/a.b_c__d---e/f-g", Reference{Host: "reg.example", Repo: "a.b_c__d---e/f-g", Tag: "latest"}, "reg.example/a.b_c__d---e/f-g:latest"},
		{"Reg.Example.COM/x", Reference{Host: "Reg.Example.COM", Repo: "x", Tag: "latest"}, "Reg.Example.COM/x:latest"},
	} {
		got, err := ParseReference(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.in, got, tc.want)
		}
		str := tc.str
		if str == "" {
			str = tc.in
		}
		if got.String() != str {
			t.Errorf("%s: String() = %s, want %s", tc.in, got.String(), str)
		}
	}
}

func TestReferenceRef(t *testing.T) {
	r, _ := ParseReference("reg.example/x:1.0@sha256:" + hexA)
	if r.Ref() != "sha256:"+hexA {
		t.Fatal(r.Ref())
	}
	r, _ = ParseReference("reg.example/x:1.0")
	if r.Ref() != "1.0" {
		t.Fatal(r.Ref())
	}
}

func TestParseReferenceBad(t *testing.T) {
	for _, tc := range []struct{ in, why string }{
		{"", "no registry host"},
		{"http://reg.example/x", "URL scheme"},
		{"https://reg.example/x:1", "URL scheme"},
		{"alpine", "no registry host"},
		{"library/alpine", "not a registry host"},
		{"reg.example/Kiln/installer", "repository"},
		{"reg.example/kiln/Installer:1", "repository"},
		{"reg.example/", "repository is empty"},
		{"reg.example//x", "repository"},
		{"reg.example/x/", "repository"},
		{"reg.example/-x", "repository"},
		{"reg.example/x_", "repository"},
		{"reg.example/x..y", "repository"},
		{"reg.example/x:", "tag"},
		{"reg.example/x:.hidden", "tag"},
		{"reg.example/x:" + strings.Repeat("a", 129), "tag"},
		{"reg.example/x:a/b", "tag"},
		{"reg.example/x@sha256:" + strings.ToUpper(hexA), "digest"},
		{"reg.example/x@sha256:abc", "digest"},
		{"reg.example/x@sha512:" + hexA + hexA, "digest"},
		{"reg.example/x@", "digest"},
		{"reg.example:0/x", "bad port"},
		{"reg.example:99999/x", "bad port"},
		{"reg.example:/x", "bad port"},
		{"reg..example/x", "DNS name"},
		{"-reg.example/x", "DNS name"},
		{"reg_example.com/x", "DNS name"},
		{"[::1/x", "IPv6"},
		{"[1.2.3.4]:5/x", "IPv6"},
		{"user@reg.example/x", "digest"},
		{"reg.example/x y", "repository"},
		{strings.Repeat("a", 1025), "longer than"},
		{"reg.example/" + strings.Repeat("a", 256), "longer than 255"},
	} {
		_, err := ParseReference(tc.in)
		if err == nil {
			t.Errorf("%q: parsed, want an error about %s", tc.in, tc.why)
			continue
		}
		if !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%q: error %q does not mention %q", tc.in, err, tc.why)
		}
	}
}
