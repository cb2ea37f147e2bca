package redact

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	cases := map[string]string{
		"https://registry.example.com/v2/kiln/installer/manifests/1.2":                            "https://registry.example.com/v2/kiln/installer/manifests/1.2",
		"https://user:s3cret@host.example/kiln.yaml":                                              "https://REDACTED@host.example/kiln.yaml",
		"https://tokenonly@host.example/x":                                                        "https://REDACTED@host.example/x",
		"https://bucket.s3.amazonaws.com/installer.tar?X-Amz-Signature=abc&X-Amz-Credential=AKIA": "https://bucket.s3.amazonaws.com/installer.tar?REDACTED",
		"https://a.blob.core.windows.net/c/i.tar?sv=2020&sig=xyz%3D":                              "https://a.blob.core.windows.net/c/i.tar?REDACTED",
		"http://10.0.0.1/kiln.yaml#sha256=" + strings.Repeat("ab", 32):                            "http://10.0.0.1/kiln.yaml#sha256=" + strings.Repeat("ab", 32),
		"https://idp.example/cb#access_token=secret":                                              "https://idp.example/cb#REDACTED",
		"https://host.example/path?":                                                              "https://host.example/path?REDACTED",
		"http://[fe80::1%25eth0]:8080/a":                                                          "http://[fe80::1%25eth0]:8080/a",
		"mailto:someone@example.com":                                                              "mailto:REDACTED",
		"":                                                                                        "",
	}
	for in, want := range cases {
		if got := String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
	if URL(nil) != "" {
		t.Error("URL(nil) is not empty")
	}
}

func TestStringUnparseable(t *testing.T) {
	// url.Parse refuses these (a space in the host, a bad escape); the secrets still go
	for _, in := range []string{
		"https://user:pa ss@ho st/x?sig=secret",
		"https://user:secret@host/%zz?sig=secret",
		"https://user:secret@host:port/a?sig=secret#frag",
	} {
		if _, err := url.Parse(in); err == nil {
			t.Fatalf("%q parses; the test wants one that does not", in)
		}
		got := String(in)
		if strings.Contains(got, "secret") || !strings.HasPrefix(got, "https://REDACTED@") {
			t.Errorf("String(%q) = %q", in, got)
		}
	}
}

func TestText(t *testing.T) {
	in := `Get "https://u:p4ss@cdn.example/blob?X-Amz-Signature=deadbeef": dial tcp: timeout; see https://docs.example/why.`
	got := Text(in)
	want := `Get "https://REDACTED@cdn.example/blob?REDACTED": dial tcp: timeout; see https://docs.example/why.`
	if got != want {
		t.Errorf("Text:\n got %s\nwant %s", got, want)
	}
	if Text("no urls here: a@b?c") != "no urls here: a@b?c" {
		t.Error("text without a URL changed")
	}
}

func TestError(t *testing.T) {
	base := errors.New("boom")
	err := fmt.Errorf("GET https://h.example/x?token=abc: %w", base)
	red := Error(err)
	if strings.Contains(red.Error(), "abc") || !errors.Is(red, base) {
		t.Errorf("Error: %v (Is base: %v)", red, errors.Is(red, base))
	}
	if Error(nil) != nil {
		t.Error("Error(nil) is not nil")
	}
	if Error(base) != base {
		t.Error("an error without a URL is wrapped")
	}
}
