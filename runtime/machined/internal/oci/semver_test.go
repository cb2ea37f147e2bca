package oci

import (
	"sort"
	"strings"
	"testing"
)

func TestValidVersion(t *testing.T) {
	for v, want := range map[string]bool{
		"1.2.3": true, "v1.2.3": true, "0.0.0": true, "1.2.3-rc.1": true, "1.2.3-rc.1+build.5": true,
		"1.2.3+001": true, "1.2.3-0": true, "1.2.3-x-y-z.--": true, "10.20.30": true,
		"99999999999999999999999.1.1": true,
		"":                            false, "1": false, "1.2": false, "1.2.3.4": false, "01.2.3": false, "1.02.3": false,
		"1.2.03": false, "1.2.3-": false, "1.2.3+": false, "1.2.3-01": false, "1.2.3-rc..1": false,
		"1.2.3-rc_1": false, "v": false, "vv1.2.3": false, "V1.2.3": false, "1.2.3 ": false, " 1.2.3": false,
		"-1.2.3": false, "1.-2.3": false, "+1.2.3": false, "1.2.3+a+b": false, "a.b.c": false,
		"1.2.3-" + strings.Repeat("a", 300): false,
	} {
		if ValidVersion(v) != want {
			t.Errorf("ValidVersion(%q) = %v", v, !want)
		}
	}
}

func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"1.2.3", "1.2.3", 0},
		{"v1.2.3", "1.2.3", 0},
		{"1.2.3+build.1", "1.2.3+build.2", 0},
		{"1.2.3", "1.2.4", -1},
		{"1.10.0", "1.9.0", 1},
		{"2.0.0", "10.0.0", -1},
		{"1.0.0-rc.1", "1.0.0", -1},
		{"1.0.0", "1.0.0-rc.1", 1},
		{"1.0.0-alpha", "1.0.0-alpha.1", -1},
		{"1.0.0-alpha.1", "1.0.0-alpha.beta", -1},
		{"1.0.0-beta.2", "1.0.0-beta.11", -1},
		{"1.0.0-rc.1", "1.0.0-rc.1+x", 0},
		{"1.0.0-1", "1.0.0-a", -1},
		{"1.0.0-B", "1.0.0-a", -1}, // ASCII order
		{"1.0.0-rc.10", "1.0.0-rc.9", 1},
		{"99999999999999999999999.0.0", "99999999999999999999998.0.0", 1},
		{"garbage", "0.0.0", -1},
		{"0.0.0", "garbage", 1},
		{"garbage", "", 0},
		{"1.2", "1.2.0", -1},
	} {
		if got := CompareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := CompareVersions(tc.b, tc.a); got != -tc.want {
			t.Errorf("CompareVersions(%q, %q) = %d, want %d", tc.b, tc.a, got, -tc.want)
		}
	}
}

// semver.org's own example of precedence.
func TestVersionPrecedenceChain(t *testing.T) {
	chain := []string{"1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
		"1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.1.0", "2.0.0"}
	shuffled := append([]string(nil), chain...)
	for i := range shuffled {
		j := (i * 7) % len(shuffled)
		shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
	}
	sort.Slice(shuffled, func(i, j int) bool { return CompareVersions(shuffled[i], shuffled[j]) < 0 })
	if strings.Join(shuffled, " ") != strings.Join(chain, " ") {
		t.Fatalf("sorted: %v", shuffled)
	}
}
