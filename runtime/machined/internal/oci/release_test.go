package oci

import (
	"strings"
	"testing"
)

func TestChannelAccepts(t *testing.T) {
	for _, tc := range []struct {
		follow, release string
		want            bool
	}{
		{"stable", "stable", true}, {"stable", "beta", false}, {"stable", "alpha", false},
		{"beta", "stable", true}, {"beta", "beta", true}, {"beta", "alpha", false},
		{"alpha", "stable", true}, {"alpha", "beta", true}, {"alpha", "alpha", true},
		{"nightly", "stable", false}, {"stable", "", false}, {"", "stable", false}, {"Stable", "stable", false},
	} {
		if got := ChannelAccepts(tc.follow, tc.release); got != tc.want {
			t.Errorf("ChannelAccepts(%q, %q) = %v", tc.follow, tc.release, got)
		}
	}
}

func TestChooseRelease(t *testing.T) {
	rel := func(v, ch, from string) Release {
		return Release{Tag: v, Version: v, Channel: ch, UpgradeFrom: from, Architecture: "amd64"}
	}
	all := []Release{
		rel("1.0.0", "stable", ""),
		rel("1.1.0", "stable", ""),
		rel("1.2.0-beta.1", "beta", ""),
		rel("1.2.0-alpha.3", "alpha", ""),
		rel("1.3.0-alpha.1", "alpha", ""),
		{Tag: "junk", Version: "not-a-version", Channel: "stable", Architecture: "amd64"},
		{Tag: "9.0.0-arm", Version: "9.0.0", Channel: "stable", Architecture: "arm64"},
	}
	for _, tc := range []struct {
		name      string
		releases  []Release
		current   string
		channel   string
		arch      string
		downgrade bool
		want      string // the chosen tag, or "error: <substring>"
	}{
		{"stable takes stable", all, "1.0.0", "stable", "amd64", false, "1.1.0"},
		{"beta takes beta over older stable", all, "1.0.0", "beta", "amd64", false, "1.2.0-beta.1"},
		{"alpha takes everything", all, "1.0.0", "alpha", "amd64", false, "1.3.0-alpha.1"},
		{"a pre-release is older than its release", []Release{rel("1.2.0-rc.1", "stable", "")}, "1.2.0", "stable", "amd64", false, "error: no release in channel stable is newer than 1.2.0 (newest: 1.2.0-rc.1)"},
		{"nothing newer", all, "1.1.0", "stable", "amd64", false, "error: no release in channel stable is newer than 1.1.0 (newest: 1.1.0)"},
		{"downgrade refused", all, "2.0.0", "stable", "amd64", false, "error: is newer than 2.0.0 (newest: 1.1.0)"},
		{"downgrade allowed", all, "2.0.0", "stable", "amd64", true, "1.1.0"},
		{"downgrade allowed skips current", all, "1.1.0", "stable", "amd64", true, "1.0.0"},
		{"downgrade allowed but only current", []Release{rel("1.1.0", "stable", "")}, "1.1.0", "stable", "amd64", true, "error: differs from"},
		{"arch mismatch", all, "1.0.0", "stable", "riscv64", false, `error: no release for architecture riscv64 (found: "amd64", "arm64")`},
		{"other arch", all, "1.0.0", "stable", "arm64", false, "9.0.0-arm"},
		{"empty arch matches nothing", []Release{{Tag: "x", Version: "2.0.0", Channel: "stable"}}, "1.0.0", "stable", "amd64", false, `error: (found: "")`},
		{"no arch asked", all, "1.0.0", "stable", "", false, "error: no architecture"},
		{"channel has nothing", []Release{rel("2.0.0", "alpha", "")}, "1.0.0", "stable", "amd64", false, "error: no release for amd64 in channel stable"},
		{"unknown channel", all, "1.0.0", "edge", "amd64", false, `error: unknown channel "edge"`},
		{"no releases", nil, "1.0.0", "stable", "amd64", false, "error: no releases published"},
		{"only junk", []Release{{Version: "x", Architecture: "amd64"}}, "1.0.0", "stable", "amd64", false, "error: none of the 1 releases has a valid semantic version"},
		{"upgrade-from met", []Release{rel("2.0.0", "stable", "1.0.0")}, "1.0.0", "stable", "amd64", false, "2.0.0"},
		{"upgrade-from falls back to an older release", []Release{rel("2.0.0", "stable", "1.5.0"), rel("1.5.0", "stable", "")}, "1.0.0", "stable", "amd64", false, "1.5.0"},
		{"upgrade-from blocks", []Release{rel("2.0.0", "stable", "1.5.0")}, "1.0.0", "stable", "amd64", false, "error: no release in channel stable can be installed over \"1.0.0\": 2.0.0 upgrades only from 1.5.0 or newer"},
		{"upgrade-from invalid", []Release{rel("2.0.0", "stable", "one")}, "1.0.0", "stable", "amd64", false, `error: 2.0.0 has an invalid upgrade-from "one"`},
		{"unknown current takes any", all, "", "stable", "amd64", false, "1.1.0"},
		{"unknown current blocked by upgrade-from", []Release{rel("2.0.0", "stable", "1.0.0")}, "dev", "stable", "amd64", false, "error: upgrades only from 1.0.0"},
		{"same version two tags", []Release{{Tag: "b", Version: "2.0.0", Channel: "stable", Architecture: "amd64"}, {Tag: "a", Version: "v2.0.0", Channel: "stable", Architecture: "amd64"}}, "1.0.0", "stable", "amd64", false, "a"},
		{"build metadata is not newer", []Release{rel("1.0.0+rebuild", "stable", "")}, "1.0.0", "stable", "amd64", false, "error: is newer than"},
	} {
		got, err := ChooseRelease(tc.releases, tc.current, tc.channel, tc.arch, tc.downgrade)
		if want := strings.TrimPrefix(tc.want, "error: "); want != tc.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: got %+v, %v; want an error containing %q", tc.name, got, err, want)
			}
			continue
		}
		if err != nil || got.Tag != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got.Tag, err, tc.want)
		}
	}
}

func TestReleaseOf(t *testing.T) {
	img := Image{
		Manifest: Manifest{Annotations: map[string]string{AnnotationChannel: "stable", AnnotationUpgradeFrom: "1.0.0"}},
		Config: ImageConfig{Architecture: "arm64", Config: ContainerConfig{Labels: map[string]string{
			AnnotationVersion: "1.4.0", AnnotationChannel: "alpha",
		}}},
	}
	got := ReleaseOf("t", img)
	want := Release{Tag: "t", Version: "1.4.0", Channel: "stable", UpgradeFrom: "1.0.0", Architecture: "arm64"}
	if got != want {
		t.Fatalf("got %+v", got)
	}
	img.Manifest.Annotations[AnnotationArch] = "amd64"
	img.Manifest.Annotations[AnnotationVersion] = "1.5.0"
	if got := ReleaseOf("t", img); got.Architecture != "amd64" || got.Version != "1.5.0" {
		t.Fatalf("annotations must win: %+v", got)
	}
	if got := ReleaseOf("", Image{}); got != (Release{}) {
		t.Fatalf("empty image: %+v", got)
	}
}
