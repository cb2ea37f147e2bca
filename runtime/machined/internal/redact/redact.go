// Package redact is the one way machined shows a URL that a user, a config or a server gave
// it: in the console, in /v1/status and in errors. Credentials (a URL's userinfo) and query
// strings (presigned URLs carry their signature there: S3's X-Amz-Signature, Azure's SAS
// sig=, GCS's X-Goog-Signature) never appear; scheme, host and path stay, so a line still
// says where it went. A fragment stays only when it is Kiln's own "#sha256=<hex>" digest,
// which is no secret and tells which bytes were wanted.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Marker stands where something was taken out.
const Marker = "REDACTED"

// URL shows u without its userinfo, query or (unless it is a sha256 digest) fragment.
func URL(u *url.URL) string {
	if u == nil {
		return ""
	}
	if u.Opaque != "" { // "mailto:x" and the like: nothing structured to keep
		return u.Scheme + ":" + Marker
	}
	v := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	if u.User != nil {
		v.User = url.User(Marker)
	}
	if u.RawQuery != "" || u.ForceQuery {
		v.RawQuery = Marker
	}
	if u.Fragment != "" {
		v.Fragment = Marker
		if digestFragment.MatchString(u.Fragment) {
			v.Fragment = u.Fragment
		}
	}
	return v.String()
}

var digestFragment = regexp.MustCompile(`^sha256=[0-9a-fA-F]{64}$`)

// String shows a URL given as text. What does not parse is cut by hand the same way (no
// userinfo, nothing after '?' or '#'), so even a malformed URL never shows its secrets.
func String(s string) string {
	if u, err := url.Parse(s); err == nil {
		return URL(u)
	}
	return byHand(s)
}

// byHand redacts text that url.Parse refused: the query and fragment go, and so does
// everything before the last '@' of the authority.
func byHand(s string) string {
	rest, tail := s, ""
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest, tail = rest[:i], "?"+Marker
	}
	prefix := ""
	if i := strings.Index(rest, "://"); i >= 0 {
		prefix, rest = rest[:i+3], rest[i+3:]
	} else if strings.HasPrefix(rest, "//") {
		prefix, rest = "//", rest[2:]
	}
	authority, path := rest, ""
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		authority, path = rest[:i], rest[i:]
	}
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		authority = Marker + "@" + authority[i+1:]
	}
	return prefix + authority + path + tail
}

// urlInText finds URLs in free text: a scheme, "://", then everything up to white space or
// a quote (Go's %q quotes, JSON's strings).
var urlInText = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>` + "`" + `]+`)

// Text redacts every URL in s: for messages that may quote one (an error from net/http
// names the URL it failed on, query included).
func Text(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	return urlInText.ReplaceAllStringFunc(s, func(m string) string {
		// a URL quoted in prose often ends the sentence: keep that punctuation outside
		trimmed := strings.TrimRight(m, ".,;:)]}")
		return String(trimmed) + m[len(trimmed):]
	})
}

// Error is err with every URL in its message redacted; errors.Is and errors.As still see
// the original through Unwrap. nil stays nil.
func Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := Text(msg); red != msg {
		return &redacted{msg: red, err: err}
	}
	return err
}

type redacted struct {
	msg string
	err error
}

func (r *redacted) Error() string { return r.msg }
func (r *redacted) Unwrap() error { return r.err }
