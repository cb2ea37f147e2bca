package redact

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzRedact: for any text, String and Text never panic, and what String returns parses (when
// it does) with no credentials and no query but the marker.
func FuzzRedact(f *testing.F) {
	for _, seed := range []string{
		"https://user:pass@host/p?q=1#f", "http://h/x#sha256=00", "https://u@h", "ftp://a@b@c/d?e",
		"%zz://x", "https://[::1]:1/a?b", "a://b?c#d", "x", "https://h/a b?sig=1",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := String(s)
		_ = Text(s)
		u, err := url.Parse(out)
		if err != nil {
			return
		}
		if u.User != nil && u.User.String() != Marker {
			t.Fatalf("String(%q) = %q keeps userinfo %q", s, out, u.User.String())
		}
		if u.RawQuery != "" && u.RawQuery != Marker {
			t.Fatalf("String(%q) = %q keeps query %q", s, out, u.RawQuery)
		}
		if in, err := url.Parse(s); err == nil && in.Opaque == "" {
			if pw, ok := in.User.Password(); ok && len(pw) >= 8 && !strings.Contains(in.Host+in.EscapedPath(), pw) && strings.Contains(out, pw) {
				t.Fatalf("String(%q) = %q shows the password", s, out)
			}
		}
	})
}
