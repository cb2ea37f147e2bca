package oci

import "strings"

// Kiln versions are semantic versions (semver.org 2.0.0). This is hand-written because machined
// is standard library only: golang.org/x/mod/semver would have to be vendored into PID 1 for a
// hundred lines. Differences from x/mod/semver: "v" is optional and "1.2" is not a version.

type version struct {
	major, minor, patch string   // decimal, no leading zeros
	pre                 []string // pre-release identifiers
}

const maxVersion = 256

// ValidVersion reports whether v is MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD], with an optional
// leading "v".
func ValidVersion(v string) bool {
	_, ok := parseVersion(v)
	return ok
}

// CompareVersions orders a and b by semver precedence: -1, 0 or 1. Build metadata is ignored;
// an invalid version sorts below every valid one (and equal to another invalid one).
func CompareVersions(a, b string) int {
	va, okA := parseVersion(a)
	vb, okB := parseVersion(b)
	switch {
	case !okA && !okB:
		return 0
	case !okA:
		return -1
	case !okB:
		return 1
	}
	if c := compareNumbers(va.major, vb.major); c != 0 {
		return c
	}
	if c := compareNumbers(va.minor, vb.minor); c != 0 {
		return c
	}
	if c := compareNumbers(va.patch, vb.patch); c != 0 {
		return c
	}
	return comparePre(va.pre, vb.pre)
}

func parseVersion(v string) (version, bool) {
	if len(v) > maxVersion {
		return version{}, false
	}
	v = strings.TrimPrefix(v, "v")
	if i := strings.IndexByte(v, '+'); i >= 0 {
		if !validIdentifiers(v[i+1:], false) {
			return version{}, false
		}
		v = v[:i]
	}
	var pre string
	hasPre := false
	if i := strings.IndexByte(v, '-'); i >= 0 {
		v, pre, hasPre = v[:i], v[i+1:], true
		if !validIdentifiers(pre, true) {
			return version{}, false
		}
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return version{}, false
	}
	for _, p := range parts {
		if !isNumber(p) {
			return version{}, false
		}
	}
	out := version{major: parts[0], minor: parts[1], patch: parts[2]}
	if hasPre {
		out.pre = strings.Split(pre, ".")
	}
	return out, true
}

// validIdentifiers checks dot-separated non-empty [0-9A-Za-z-]+ identifiers; numeric
// pre-release identifiers may not have leading zeros (build identifiers may).
func validIdentifiers(s string, pre bool) bool {
	for _, id := range strings.Split(s, ".") {
		if id == "" {
			return false
		}
		for _, c := range id {
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '-') {
				return false
			}
		}
		if pre && allDigits(id) && len(id) > 1 && id[0] == '0' {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

func isNumber(s string) bool { return allDigits(s) && (len(s) == 1 || s[0] != '0') }

// compareNumbers compares decimals without leading zeros of any length: no overflow.
func compareNumbers(a, b string) int {
	if len(a) != len(b) {
		if len(a) < len(b) {
			return -1
		}
		return 1
	}
	return strings.Compare(a, b)
}

// comparePre applies semver's pre-release rules: a release sorts after its pre-releases;
// identifiers compare numerically when both are numeric, numeric below alphanumeric, else in
// ASCII order; a shorter list of otherwise equal identifiers sorts first.
func comparePre(a, b []string) int {
	switch {
	case len(a) == 0 && len(b) == 0:
		return 0
	case len(a) == 0:
		return 1
	case len(b) == 0:
		return -1
	}
	for i := 0; i < len(a) && i < len(b); i++ {
		na, nb := allDigits(a[i]), allDigits(b[i])
		var c int
		switch {
		case na && nb:
			c = compareNumbers(a[i], b[i])
		case na:
			c = -1
		case nb:
			c = 1
		default:
			c = strings.Compare(a[i], b[i])
		}
		if c != 0 {
			return c
		}
	}
	switch {
	case len(a) < len(b):
		return -1
	case len(a) > len(b):
		return 1
	}
	return 0
}
