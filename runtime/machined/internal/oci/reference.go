package oci

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
)

// Reference names an image: HOST[:PORT]/REPO[:TAG][@sha256:HEX]. The host is required (no
// implied Docker Hub): a machine must say where its upgrades come from.
type Reference struct {
	Host   string // host[:port], "[ipv6]:port" included
	Repo   string // repository path, lowercase components
	Tag    string // "" only when Digest is set
	Digest string // "sha256:<hex>" or ""
}

var (
	// The distribution spec's repository name grammar.
	repoComponent = `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`
	repoPattern   = regexp.MustCompile(`^` + repoComponent + `(?:/` + repoComponent + `)*$`)
	tagPattern    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

const (
	maxReference = 1024
	maxRepo      = 255
)

// ParseReference parses and validates s; the tag defaults to "latest" when neither tag nor
// digest is given. A URL scheme is refused: whether to use TLS is the registry's setting.
func ParseReference(s string) (Reference, error) {
	if len(s) > maxReference {
		return Reference{}, fmt.Errorf("image reference is longer than %d bytes", maxReference)
	}
	if strings.Contains(s, "://") {
		return Reference{}, fmt.Errorf("image reference %s has a URL scheme: write HOST/REPO[:TAG] (plain http is a registry setting)", quote(s))
	}
	var r Reference
	rest := s
	if i := strings.IndexByte(rest, '@'); i >= 0 {
		rest, r.Digest = rest[:i], rest[i+1:]
		if !ValidDigest(r.Digest) {
			return Reference{}, fmt.Errorf("image reference %s: digest is not sha256:<64 lowercase hex digits>", quote(s))
		}
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return Reference{}, fmt.Errorf("image reference %s has no registry host: write HOST/REPO[:TAG]", quote(s))
	}
	r.Host, rest = rest[:i], rest[i+1:]
	if err := checkHost(r.Host); err != nil {
		return Reference{}, fmt.Errorf("image reference %s: %w", quote(s), err)
	}
	if j := strings.LastIndexByte(rest, ':'); j >= 0 {
		rest, r.Tag = rest[:j], rest[j+1:]
		if !tagPattern.MatchString(r.Tag) {
			return Reference{}, fmt.Errorf("image reference %s: tag %s is not [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", quote(s), quote(r.Tag))
		}
	}
	r.Repo = rest
	if err := checkRepo(r.Repo); err != nil {
		return Reference{}, fmt.Errorf("image reference %s: %w", quote(s), err)
	}
	if r.Tag == "" && r.Digest == "" {
		r.Tag = "latest"
	}
	return r, nil
}

// String formats r back to HOST/REPO[:TAG][@DIGEST].
func (r Reference) String() string {
	s := r.Host + "/" + r.Repo
	if r.Tag != "" {
		s += ":" + r.Tag
	}
	if r.Digest != "" {
		s += "@" + r.Digest
	}
	return s
}

// Ref is what Source.Resolve takes for r: the digest when there is one (it pins the
// content), else the tag.
func (r Reference) Ref() string {
	if r.Digest != "" {
		return r.Digest
	}
	return r.Tag
}

func checkRepo(repo string) error {
	if repo == "" {
		return errors.New("repository is empty")
	}
	if len(repo) > maxRepo {
		return fmt.Errorf("repository is longer than %d bytes", maxRepo)
	}
	if !repoPattern.MatchString(repo) {
		return fmt.Errorf("repository %s is not lowercase [a-z0-9] components joined by . _ __ or - and separated by /", quote(repo))
	}
	return nil
}

// checkHost accepts a DNS name or IP address with an optional port. It must look like a host,
// not a repository component: contain '.' or ':' or be "localhost".
func checkHost(h string) error {
	if h == "" {
		return errors.New("registry host is empty")
	}
	if len(h) > 255 {
		return errors.New("registry host is longer than 255 bytes")
	}
	if !strings.ContainsAny(h, ".:") && h != "localhost" {
		return fmt.Errorf("%s is not a registry host (it needs a '.', a ':port' or to be localhost)", quote(h))
	}
	name := h
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 || net.ParseIP(h[1:end]) == nil || !strings.Contains(h[1:end], ":") {
			return fmt.Errorf("registry host %s is not a bracketed IPv6 address", quote(h))
		}
		if rest := h[end+1:]; rest != "" && (rest[0] != ':' || !validPort(rest[1:])) {
			return fmt.Errorf("registry host %s has a bad port", quote(h))
		}
		return nil
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		if !validPort(h[i+1:]) {
			return fmt.Errorf("registry host %s has a bad port", quote(h))
		}
		name = h[:i]
	}
	for _, label := range strings.Split(name, ".") {
		if !validLabel(label) {
			return fmt.Errorf("registry host %s is not a DNS name or IPv4 address", quote(h))
		}
	}
	return nil
}

func validLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for _, c := range l {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func validPort(p string) bool {
	if p == "" || len(p) > 5 || p[0] == '0' {
		return false
	}
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n <= 65535 && strconv.Itoa(n) == p
}
