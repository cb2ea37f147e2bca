package oci

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Annotation keys: the contract with `kiln release push`, which annotates each release's
// manifest (src/kiln/installer/release.py) and each layer with its role
// (src/kiln/image/outputs/installer.py).
const (
	AnnotationVersion     = "org.opencontainers.image.version"
	AnnotationChannel     = "dev.kiln.channel"
	AnnotationArch        = "dev.kiln.architecture"
	AnnotationUpgradeFrom = "dev.kiln.upgrade-from"
	AnnotationLayer       = "dev.kiln.layer" // on layer descriptors: "boot", "disk" or "installer"
)

// Release is what machined needs to know of a published installer image to choose it.
type Release struct {
	Tag          string // the registry tag it was found under
	Version      string // semantic version
	Channel      string // "alpha", "beta" or "stable"
	UpgradeFrom  string // the oldest version that may upgrade to it; "" for any
	Architecture string // GOARCH, e.g. "amd64"
}

// channelRank orders channels by stability.
var channelRank = map[string]int{"alpha": 0, "beta": 1, "stable": 2}

// ChannelAccepts reports whether a machine following channel follow takes a release published
// to channel release: any release at least as stable as what it follows. Unknown channels
// accept and are accepted by nothing.
func ChannelAccepts(follow, release string) bool {
	f, ok1 := channelRank[follow]
	r, ok2 := channelRank[release]
	return ok1 && ok2 && r >= f
}

// ReleaseOf reads a release from an image: each field from the manifest's annotation, else the
// config's label of the same key; the architecture last from the config's architecture.
func ReleaseOf(tag string, img Image) Release {
	get := func(key string) string {
		if v := img.Manifest.Annotations[key]; v != "" {
			return v
		}
		return img.Config.Config.Labels[key]
	}
	r := Release{
		Tag:          tag,
		Version:      get(AnnotationVersion),
		Channel:      get(AnnotationChannel),
		UpgradeFrom:  get(AnnotationUpgradeFrom),
		Architecture: get(AnnotationArch),
	}
	if r.Architecture == "" {
		r.Architecture = img.Config.Architecture
	}
	return r
}

// ChooseRelease picks the newest release (by semver) that channel accepts, built for arch, that
// the current version may upgrade from (UpgradeFrom "" or <= current), and newer than current
// (with allowDowngrade: any version but current). Releases with invalid versions are skipped.
// When none qualifies the error says why, at the last hurdle the releases got to.
func ChooseRelease(releases []Release, current, channel, arch string, allowDowngrade bool) (Release, error) {
	if _, ok := channelRank[channel]; !ok {
		return Release{}, fmt.Errorf("unknown channel %s (alpha, beta or stable)", quote(channel))
	}
	if arch == "" {
		return Release{}, errors.New("no architecture to choose a release for")
	}
	if len(releases) == 0 {
		return Release{}, errors.New("no releases published")
	}
	var valid, forArch, inChannel []Release
	archs := map[string]bool{}
	for _, r := range releases {
		if !ValidVersion(r.Version) {
			continue
		}
		valid = append(valid, r)
		if r.Architecture != arch {
			archs[quote(r.Architecture)] = true
			continue
		}
		forArch = append(forArch, r)
		if ChannelAccepts(channel, r.Channel) {
			inChannel = append(inChannel, r)
		}
	}
	switch {
	case len(valid) == 0:
		return Release{}, fmt.Errorf("none of the %d releases has a valid semantic version", len(releases))
	case len(forArch) == 0:
		return Release{}, fmt.Errorf("no release for architecture %s (found: %s)", arch, orNone(sortedKeys(archs)))
	case len(inChannel) == 0:
		return Release{}, fmt.Errorf("no release for %s in channel %s", arch, channel)
	}
	// Newest first; equal versions (one image under two tags) by tag, so the choice is stable.
	sort.SliceStable(inChannel, func(i, j int) bool {
		if c := CompareVersions(inChannel[i].Version, inChannel[j].Version); c != 0 {
			return c > 0
		}
		return inChannel[i].Tag < inChannel[j].Tag
	})
	newest := inChannel[0].Version
	var blocked []string
	for _, r := range inChannel {
		c := CompareVersions(r.Version, current)
		if c == 0 || (c < 0 && !allowDowngrade) {
			continue
		}
		if r.UpgradeFrom != "" {
			if !ValidVersion(r.UpgradeFrom) {
				blocked = append(blocked, fmt.Sprintf("%s has an invalid upgrade-from %s", r.Version, quote(r.UpgradeFrom)))
				continue
			}
			if CompareVersions(r.UpgradeFrom, current) > 0 {
				blocked = append(blocked, fmt.Sprintf("%s upgrades only from %s or newer", r.Version, r.UpgradeFrom))
				continue
			}
		}
		return r, nil
	}
	switch {
	case len(blocked) > 0:
		if len(blocked) > 5 {
			blocked = append(blocked[:5], "...")
		}
		return Release{}, fmt.Errorf("no release in channel %s can be installed over %s: %s", channel, quote(current), strings.Join(blocked, "; "))
	case allowDowngrade:
		return Release{}, fmt.Errorf("no release in channel %s differs from %s (newest: %s)", channel, quote(current), newest)
	}
	return Release{}, fmt.Errorf("no release in channel %s is newer than %s (newest: %s)", channel, current, newest)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
