package main

// POST /v1/upgrade: pull an installer image (a registry reference, a release channel of a
// repository, or an OCI layout tarball at a URL), check it and its signature (upgrade_policy.go:
// unsigned only when the config allows it by name), stop the services, unmount what lives on the
// owned disk, and run the image's own machined (`install --upgrade`) in a sandbox
// (upgrade_sandbox.go) where only BOOT is writable. It writes the other slot and puts it on
// trial; machined reboots into it. Every step before the reboot that fails leaves the machine on
// its current version with its services running again and the boot state as it was, and says
// why in the status and the log.
// docs/upgrades.md tells the whole story.

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"kiln/machined/internal/bootstate"
	"kiln/machined/internal/oci"
	"kiln/machined/internal/persist"
	"kiln/machined/internal/redact"
	"kiln/machined/internal/resource"
	"kiln/machined/internal/safefile"
	"kiln/machined/internal/safego"
	"kiln/machined/internal/supervisor"
)

const (
	upgradeWork      = "/run/kiln/upgrade" // a tmpfs: what is pulled never touches the owned disk
	upgradeMaxBytes  = 1 << 30             // what an image may unpack to, all its layers together
	upgradeMaxFiles  = 100000              // tar entries in one layer; the tmpfs holds this many inodes in all
	upgradeMaxTar    = 2 << 30             // an OCI layout tarball fetched from a URL
	installerTimeout = 10 * time.Minute
	pullTimeout      = 30 * time.Minute
	channelLookups   = 32 // manifests read to choose a release from a channel
)

// upgradeTmpfsOptions size the tmpfs the image is unpacked into: the unpack budget and room
// for the metadata, so a hostile image fills at most this much memory even where a count is off.
var upgradeTmpfsOptions = fmt.Sprintf("mode=0700,size=%dk,nr_inodes=%d", (upgradeMaxBytes+64<<20)>>10, 2*upgradeMaxFiles)

// upgradeBudget is what all of an image's layers may unpack to (a variable for tests).
var upgradeBudget int64 = upgradeMaxBytes

// The states of an upgrade, as /v1/status shows them.
const (
	upgradePulling    = "pulling"
	upgradeInstalling = "installing"
	upgradeRebooting  = "rebooting"
	upgradeFailed     = "failed"
)

// upgradeRequest is the body of POST /v1/upgrade: exactly one of image, url or channel.
type upgradeRequest struct {
	Image          string `json:"image,omitempty"`      // HOST[:PORT]/REPO[:TAG][@sha256:...]
	URL            string `json:"url,omitempty"`        // an OCI layout tarball (kiln's installer .tar)
	Digest         string `json:"digest,omitempty"`     // with url: the manifest it must hold
	Channel        string `json:"channel,omitempty"`    // alpha, beta or stable
	Repository     string `json:"repository,omitempty"` // with channel: HOST[:PORT]/REPO
	Preserve       *bool  `json:"preserve,omitempty"`   // keep EPHEMERAL (/var); default true
	AllowDowngrade bool   `json:"allow_downgrade,omitempty"`
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// check validates a request before anything is fetched.
func (r upgradeRequest) check() error {
	given := 0
	for _, s := range []string{r.Image, r.URL, r.Channel} {
		if s != "" {
			given++
		}
	}
	if given != 1 {
		return errors.New("give exactly one of image, url or channel (with repository)")
	}
	switch {
	case r.Image != "":
		if _, err := oci.ParseReference(r.Image); err != nil {
			return fmt.Errorf("image: %v", err)
		}
	case r.URL != "":
		u, err := url.Parse(r.URL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fmt.Errorf("url %q: want an http(s) URL of an OCI layout tarball", redact.String(r.URL))
		}
	default:
		if r.Channel != "alpha" && r.Channel != "beta" && r.Channel != "stable" {
			return fmt.Errorf("channel %q: want alpha, beta or stable", r.Channel)
		}
		if _, err := oci.ParseReference(r.Repository); err != nil || r.Repository == "" {
			return fmt.Errorf("repository %q: want HOST[:PORT]/REPO with the channel", r.Repository)
		}
	}
	if r.Digest != "" && (r.URL == "" || !digestRE.MatchString(r.Digest)) {
		return errors.New("digest goes with url and must be sha256:<64 hex digits>")
	}
	if r.Repository != "" && r.Channel == "" {
		return errors.New("repository goes with channel")
	}
	return nil
}

func (r upgradeRequest) preserve() bool { return r.Preserve == nil || *r.Preserve }

func (r upgradeRequest) describe() string {
	switch {
	case r.Image != "":
		return r.Image
	case r.URL != "":
		return redact.String(r.URL) // status and console: no credentials, no presigned query
	}
	return r.Repository + " (channel " + r.Channel + ")"
}

// upgradeStatus is the upgrade section of /v1/status.
type upgradeStatus struct {
	State          string  `json:"state"`
	Number         int     `json:"number,omitempty"` // upgrade/request's number: which accepted upgrade this is
	Image          string  `json:"image,omitempty"`
	Digest         string  `json:"digest,omitempty"`
	Version        string  `json:"version,omitempty"`
	Slot           string  `json:"slot,omitempty"`
	Preserve       bool    `json:"preserve"`
	PulledBytes    int64   `json:"pulled_bytes"`
	TotalBytes     int64   `json:"total_bytes"`
	PullSeconds    float64 `json:"pull_seconds,omitempty"`
	InstallSeconds float64 `json:"install_seconds,omitempty"`
	SignedBy       string  `json:"signed_by,omitempty"` // the release key's fingerprint; empty when not checked
	Unsigned       bool    `json:"unsigned,omitempty"`  // installed without a signature (allow_unsigned)
	Error          string  `json:"error,omitempty"`
}

// apiError is a refusal the API answers with its own status code.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

// upgrader holds the one upgrade a machine may run at a time. It owns upgrade/status and puts
// each change of the status as it happens; the pulled bytes' progress at most once per
// progressEvery, as the pull counts every read.
type upgrader struct {
	mu     sync.Mutex
	status *upgradeStatus
	// publish puts the status as upgrade/status (set when the controllers start; nil without them)
	publish   func(upgradeStatus)
	published time.Time // when publish last ran
	asked     int       // upgrades accepted since boot (upgrade/request's number)
}

const (
	upgradeType  resource.Type = "upgrade/status"
	upgradeID                  = "upgrade"
	upgradeOwner               = "upgrader"

	upgradeAskType  resource.Type = "upgrade/request"
	upgradeAskID                  = "request"
	upgradeAskOwner               = "api"

	progressEvery = time.Second // how often upgrade/status follows the pulled bytes alone
)

// publishUpgrades makes the upgrader put its status as upgrade/status from now on.
func (m *machine) publishUpgrades() {
	m.upgrades.mu.Lock()
	defer m.upgrades.mu.Unlock()
	m.upgrades.publish = func(s upgradeStatus) {
		if _, err := m.resources.Put(upgradeOwner, upgradeType, upgradeID, &s); err != nil {
			m.con.printf("upgrade: %v", err)
		}
	}
}

// begin makes s the upgrade's status; u.mu is held.
func (u *upgrader) begin(s *upgradeStatus) {
	u.status = s
	u.publishLocked(true)
}

// publishLocked hands the status to publish: always when changed says more than the bytes
// pulled changed, otherwise once progressEvery has passed. u.mu is held.
func (u *upgrader) publishLocked(changed bool) {
	if u.publish == nil || u.status == nil || (!changed && time.Since(u.published) < progressEvery) {
		return
	}
	u.published = time.Now()
	u.publish(*u.status)
}

func (u *upgrader) snapshot() *upgradeStatus {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.status == nil {
		return nil
	}
	s := *u.status
	return &s
}

func (u *upgrader) update(f func(s *upgradeStatus)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	before := *u.status
	f(u.status)
	progress := before
	progress.PulledBytes = u.status.PulledBytes
	u.publishLocked(progress != *u.status)
}

// Upgrade starts an upgrade in the background and returns its first status.
func (m *machine) Upgrade(req upgradeRequest) (*upgradeStatus, error) {
	if err := req.check(); err != nil {
		return nil, &apiError{400, err.Error()}
	}
	// the config's policy first: it is what the user must change, whatever the machine's disk
	if err := m.upgradePolicy(); err != nil {
		return nil, &apiError{409, err.Error()}
	}
	if m.slots == nil || m.slots.slot == "" {
		return nil, &apiError{409, "this machine did not boot from an A/B disk; install it to a disk first"}
	}
	if m.slots.err != "" {
		return nil, &apiError{409, "the boot state cannot be read: " + m.slots.err}
	}
	if m.resources == nil {
		return nil, &apiError{409, "this machine runs no controllers to run an upgrade"}
	}
	other := bootstate.Other(m.slots.slot)
	m.upgrades.mu.Lock() // a rollback holds it while it changes the boot state
	defer m.upgrades.mu.Unlock()
	if s := m.upgrades.status; s != nil && s.State != upgradeFailed {
		return nil, &apiError{409, "an upgrade is already " + s.State}
	}
	if m.slots.defaultSlot() == other || m.slots.trialSlot() == other {
		return nil, &apiError{409, fmt.Sprintf("slot %s runs but slot %s is the default or on trial; roll back or reboot before upgrading", m.slots.slot, other)}
	}
	m.upgrades.asked++
	m.upgrades.begin(&upgradeStatus{State: upgradePulling, Number: m.upgrades.asked, Image: req.describe(), Slot: other, Preserve: req.preserve()})
	first := *m.upgrades.status
	m.con.printf("upgrade: %s into slot %s", req.describe(), other)
	ask := upgradeAsk{Number: m.upgrades.asked, Image: req.describe(), Slot: other, req: req}
	if _, err := m.resources.Put(upgradeAskOwner, upgradeAskType, upgradeAskID, ask); err != nil {
		m.upgrades.status.State, m.upgrades.status.Error = upgradeFailed, err.Error()
		m.upgrades.publishLocked(true)
		return nil, err
	}
	return &first, nil
}

// upgradeAsk is upgrade/request: the upgrade the API accepted last, which the upgrade
// controller runs. Its request is not shown: a URL may carry credentials or a presigned query.
type upgradeAsk struct {
	Number int    `json:"number"` // the how-manieth accepted since boot: each runs once
	Image  string `json:"image"`  // what it installs, without credentials or query
	Slot   string `json:"slot"`   // into which slot
	req    upgradeRequest
}

// upgradeController runs each upgrade the API accepts (upgrade/request), one at a time, in its
// own goroutine: an upgrade takes minutes, and the runtime runs each controller apart. The
// upgrader puts each step as upgrade/status (upgrade.go), which Rollback and the next request
// read under the upgrader's lock.
type upgradeController struct {
	run  func(req upgradeRequest, slot string)
	done int // the last request it ran; only this controller's goroutine touches it
}

func (c *upgradeController) Name() string             { return "upgrade" }
func (c *upgradeController) Inputs() []resource.Type  { return []resource.Type{upgradeAskType} }
func (c *upgradeController) Outputs() []resource.Type { return nil }

func (c *upgradeController) Reconcile(_ context.Context, r *resource.Run) error {
	ask, ok := specAt[upgradeAsk](r, upgradeAskType, upgradeAskID)
	if !ok || ask.Number <= c.done {
		return nil
	}
	c.done = ask.Number // before it runs: a panic in it is not retried
	c.run(ask.req, ask.Slot)
	return nil
}

// runUpgrade does the work; any error ends in the failed state, from which the volumes and
// services controllers put the machine back as it was (/var mounted, the services running).
func (m *machine) runUpgrade(req upgradeRequest, slot string) {
	err := m.pullAndInstall(req, slot)
	if err == nil {
		m.upgrades.update(func(s *upgradeStatus) { s.State = upgradeRebooting })
		done := m.upgrades.snapshot()
		m.con.printf("upgrade: slot %s holds %s and is on trial; rebooting (pull %.1f s, install %.1f s)",
			slot, done.Version, done.PullSeconds, done.InstallSeconds)
		m.Power(actionReboot)
		return
	}
	m.con.printf("upgrade: failed: %v", err)
	_ = syscall.Unmount(upgradeWork, syscall.MNT_DETACH)
	m.upgrades.update(func(s *upgradeStatus) { s.State, s.Error = upgradeFailed, err.Error() })
	m.con.printf("upgrade: the machine keeps running %s", m.version)
}

// pullAndInstall pulls the release, has the disk released to it and installs the slot.
func (m *machine) pullAndInstall(req upgradeRequest, slot string) error {
	ctx, cancel := context.WithTimeout(context.Background(), pullTimeout)
	defer cancel()
	start := time.Now()
	if err := os.MkdirAll(upgradeWork, 0o700); err != nil {
		return err
	}
	_ = syscall.Unmount(upgradeWork, syscall.MNT_DETACH) // a failed earlier try's
	// not nodev: the isolated root gets the owned disk's device nodes
	if err := syscall.Mount("tmpfs", upgradeWork, "tmpfs", syscall.MS_NOSUID, upgradeTmpfsOptions); err != nil {
		return fmt.Errorf("tmpfs for the image: %v", err)
	}
	// private: the installer's mounts in its own namespace never show up here
	_ = syscall.Mount("", upgradeWork, "", syscall.MS_PRIVATE, "")
	src, ref, err := m.upgradeSource(ctx, req)
	if err != nil {
		return err
	}
	if closer, ok := src.(io.Closer); ok {
		defer closer.Close()
	}
	img, err := src.Resolve(ctx, ref, oci.Platform{OS: "linux", Architecture: runtime.GOARCH})
	if err != nil {
		return err
	}
	signer, err := m.checkSignature(ctx, src, img.Digest)
	if err != nil {
		return err
	}
	rel := oci.ReleaseOf(ref, img)
	if err := checkChannel(req, rel); err != nil {
		return err
	}
	if err := m.acceptable(rel, req.AllowDowngrade); err != nil {
		return err
	}
	m.upgrades.update(func(s *upgradeStatus) {
		s.Digest, s.Version, s.SignedBy, s.Unsigned = img.Digest, rel.Version, signer, signer == ""
	})
	root := filepath.Join(upgradeWork, "root")
	if err := m.unpackImage(ctx, src, img, root); err != nil {
		return err
	}
	pulled := time.Since(start)
	m.upgrades.update(func(s *upgradeStatus) { s.PullSeconds = pulled.Seconds() })
	m.con.printf("upgrade: pulled %s (%s, Kiln %s, %s) in %.1f s", req.describe(), img.Digest, rel.Version, signatureNote(signer), pulled.Seconds())
	pauseAt(pauseStep(m.params), "pulled", func(f string, a ...interface{}) { m.con.printf("upgrade: "+f, a...) })

	installStart := time.Now()
	m.upgrades.update(func(s *upgradeStatus) { s.State = upgradeInstalling })
	if err := m.awaitDiskReleased(m.upgrades.snapshot().Number); err != nil {
		return err
	}
	if err := m.installSlot(root, slot, rel.Version, req.preserve()); err != nil {
		return err
	}
	m.upgrades.update(func(s *upgradeStatus) { s.InstallSeconds = time.Since(installStart).Seconds() })
	return nil
}

// upgradeSource returns where the image comes from and the reference to resolve there.
func (m *machine) upgradeSource(ctx context.Context, req upgradeRequest) (oci.Source, string, error) {
	switch {
	case req.Image != "":
		ref, _ := oci.ParseReference(req.Image)
		reg, err := m.registry(ref.Host, ref.Repo)
		if err != nil {
			return nil, "", err
		}
		if ref.Digest != "" {
			return reg, ref.Digest, nil
		}
		return reg, ref.Tag, nil
	case req.URL != "":
		u, _ := url.Parse(req.URL)
		insecure, roots, err := m.trust(u.Host)
		if err != nil {
			return nil, "", err
		}
		// read in place by byte ranges: the index, the manifest and its signature are checked
		// before a layer is fetched, and the disk image layer never is
		layout, err := oci.OpenRemoteLayout(ctx, req.URL, upgradeMaxTar, insecure, roots)
		if errors.Is(err, oci.ErrNoRanges) && m.runningConfig().unsignedAllowed() {
			// only an upgrade that may be unsigned anyway may download first
			m.con.printf("upgrade: %v; downloading the whole tarball first (allow_unsigned: true)", err)
			return m.downloadLayout(ctx, req, insecure, roots)
		}
		if errors.Is(err, oci.ErrNoRanges) {
			return nil, "", fmt.Errorf("%v: machined reads a tarball's signature before its layers, so serve it from a server that answers Range requests (nginx, Apache, object storage), or push it to a registry", err)
		}
		if err != nil {
			return nil, "", err
		}
		return layout, req.Digest, nil
	default:
		ref, _ := oci.ParseReference(req.Repository)
		reg, err := m.registry(ref.Host, ref.Repo)
		if err != nil {
			return nil, "", err
		}
		// the choice is a digest: the tag it came from may be moved before the pull
		digest, err := m.chooseFromChannel(ctx, reg, req)
		return reg, digest, err
	}
}

// downloadLayout fetches a whole layout tarball into the tmpfs (a server without byte ranges).
func (m *machine) downloadLayout(ctx context.Context, req upgradeRequest, insecure bool, roots *x509.CertPool) (oci.Source, string, error) {
	tarball := filepath.Join(upgradeWork, "installer.tar")
	n, err := oci.Download(ctx, req.URL, tarball, upgradeBudget, insecure, roots)
	if err != nil {
		return nil, "", err
	}
	m.upgrades.update(func(s *upgradeStatus) { s.PulledBytes, s.TotalBytes = n, n })
	layout, err := oci.OpenLayoutTar(tarball)
	if err != nil {
		return nil, "", err
	}
	return layout, req.Digest, nil
}

// chooseFromChannel reads the newest semver tags' manifests, picks the release to install and
// returns the digest of its image manifest: the one reference everything after uses.
func (m *machine) chooseFromChannel(ctx context.Context, reg *oci.Registry, req upgradeRequest) (string, error) {
	tags, err := reg.Tags(ctx)
	if err != nil {
		return "", err
	}
	var candidates []string
	for _, t := range tags {
		if oci.ValidVersion(t) && (req.AllowDowngrade || oci.CompareVersions(t, m.version) > 0) {
			candidates = append(candidates, t)
		}
	}
	sort.Slice(candidates, func(i, j int) bool { return oci.CompareVersions(candidates[i], candidates[j]) > 0 })
	if len(candidates) > channelLookups {
		candidates = candidates[:channelLookups]
	}
	var releases []oci.Release
	digests := map[string]string{}
	for _, t := range candidates {
		img, err := reg.Resolve(ctx, t, oci.Platform{OS: "linux", Architecture: runtime.GOARCH})
		if err != nil {
			m.con.printf("upgrade: channel %s: skipping tag %s: %v", req.Channel, t, err)
			continue
		}
		releases = append(releases, oci.ReleaseOf(t, img))
		digests[t] = img.Digest
	}
	rel, err := oci.ChooseRelease(releases, m.version, req.Channel, runtime.GOARCH, req.AllowDowngrade)
	if err != nil {
		return "", err
	}
	m.con.printf("upgrade: channel %s of %s/%s: %s (tag %s, %s)", req.Channel, reg.Host, reg.Repo, rel.Version, rel.Tag, digests[rel.Tag])
	return digests[rel.Tag], nil
}

// checkChannel checks a channel upgrade's channel again on the manifest the pull resolved (by
// the digest the choice named), so what is installed is what the channel accepts.
func checkChannel(req upgradeRequest, rel oci.Release) error {
	if req.Channel == "" || oci.ChannelAccepts(req.Channel, rel.Channel) {
		return nil
	}
	return fmt.Errorf("the release's manifest says channel %q, which channel %s does not accept", rel.Channel, req.Channel)
}

// acceptable refuses a release for another architecture, one that cannot upgrade from this
// version, and (unless allowed) one that is not newer.
func (m *machine) acceptable(rel oci.Release, allowDowngrade bool) error {
	switch {
	case rel.Architecture != "" && rel.Architecture != runtime.GOARCH:
		return fmt.Errorf("the image is for %s, this machine is %s", rel.Architecture, runtime.GOARCH)
	case !oci.ValidVersion(rel.Version):
		return fmt.Errorf("the image's version %q is not a semantic version", rel.Version)
	case rel.UpgradeFrom != "" && oci.CompareVersions(m.version, rel.UpgradeFrom) < 0:
		return fmt.Errorf("Kiln %s upgrades from %s or newer; this machine runs %s", rel.Version, rel.UpgradeFrom, m.version)
	case !allowDowngrade && oci.ValidVersion(m.version) && oci.CompareVersions(rel.Version, m.version) <= 0:
		return fmt.Errorf("Kiln %s is not newer than the running %s; ask with allow_downgrade to install it anyway", rel.Version, m.version)
	}
	return nil
}

// registry is a client for host/repo with the config's trust for that host.
func (m *machine) registry(host, repo string) (*oci.Registry, error) {
	insecure, roots, err := m.trust(host)
	if err != nil {
		return nil, err
	}
	return &oci.Registry{Host: host, Repo: repo, Insecure: insecure, RootCAs: roots, Timeout: 30 * time.Second}, nil
}

// trust is what the config says about a host: plain http only when it is marked insecure,
// and its own CA when it has one (otherwise the system's, which Kiln's rootfs may not hold).
func (m *machine) trust(host string) (bool, *x509.CertPool, error) {
	for _, r := range m.runningConfig().Registries {
		if r.Host != host {
			continue
		}
		if r.CA == "" {
			return r.Insecure, nil, nil
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(r.CA)) {
			return false, nil, fmt.Errorf("registries: %s: ca holds no PEM certificate", host)
		}
		return r.Insecure, pool, nil
	}
	return false, nil, nil
}

// unpackImage applies every layer but the disk image's (only a fresh install needs it),
// verified as it streams, then checks that the root holds an installer and a release.
func (m *machine) unpackImage(ctx context.Context, src oci.Source, img oci.Image, root string) error {
	var total int64
	var layers []oci.Descriptor
	for _, l := range img.Manifest.Layers {
		if l.Annotations[oci.AnnotationLayer] == "disk" {
			continue
		}
		layers = append(layers, l)
		total += l.Size
	}
	if total > upgradeBudget {
		return fmt.Errorf("the image's layers are %d bytes, more than the %d an upgrade may pull", total, upgradeBudget)
	}
	m.upgrades.update(func(s *upgradeStatus) { s.TotalBytes += total })
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	var unpacked int64 // one budget for all the layers, not one per layer
	for _, l := range layers {
		if unpacked >= upgradeBudget {
			return fmt.Errorf("the image unpacks to more than the %d bytes an upgrade may hold", upgradeBudget)
		}
		limits := oci.Limits{MaxBytes: upgradeBudget - unpacked, MaxEntries: upgradeMaxFiles}
		rc, err := src.Blob(ctx, l)
		if err != nil {
			return err
		}
		counted := &countingReader{r: rc, add: func(n int) {
			m.upgrades.update(func(s *upgradeStatus) { s.PulledBytes += int64(n) })
		}}
		n, err := oci.Unpack(root, counted, l.MediaType, limits)
		unpacked += n
		if err != nil {
			// bytes that are not the blob break the gzip or tar stream before its end; the
			// digest says why better (the verifying reader stops at the descriptor's size)
			if _, verr := io.Copy(io.Discard, rc); verr != nil && strings.Contains(verr.Error(), "digest mismatch") {
				err = verr
			}
		}
		rc.Close()
		if err != nil {
			return fmt.Errorf("layer %s: %v", l.Digest, err)
		}
	}
	// nothing in the image is followed from here: its links point into the machine's own files
	if st, err := lstatUnder(root, "usr/bin/installer"); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Mode&0o111 == 0 {
		return errors.New("the image has no executable /usr/bin/installer (a regular file, no link on the way): is it a Kiln installer image?")
	}
	rel, err := readRelease(root, strings.TrimPrefix(releaseDir, "/")+"/release.json")
	if err != nil {
		return err
	}
	if v := m.upgrades.snapshot().Version; v != "" && rel.Version != v {
		return fmt.Errorf("the image says version %s but its release.json says %s", v, rel.Version)
	}
	return nil
}

type countingReader struct {
	r   io.Reader
	add func(int)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.add(n)
	}
	return n, err
}

// releaseWait bounds the wait for the services to stop and the disk to be released: the
// supervisor gives each service its stop timeout, then kills it.
const releaseWait = 2 * time.Minute

// awaitDiskReleased waits until the volumes controller has released the owned disk to upgrade
// number (the services controller stops the services first, as upgrade/status says installing),
// or says why it could not.
func (m *machine) awaitDiskReleased(number int) error {
	m.con.printf("upgrade: stopping services and releasing the disk")
	released := func(res resource.Resource) bool {
		v, ok := resource.SpecOf[volumeSpec](res)
		return ok && v.ReleasedFor == number && (v.Released || v.Problem != "")
	}
	res, ok := m.awaitFor(volumeType, volumeID, releaseWait, released)
	if !ok {
		return fmt.Errorf("the services did not stop and release the disk within %s", releaseWait)
	}
	if v, _ := resource.SpecOf[volumeSpec](res); v.Problem != "" {
		return errors.New(v.Problem)
	}
	return nil
}

// installSlot mounts BOOT for the installer, runs it in its sandbox, checks the boot state it
// left and wipes EPHEMERAL when asked. Any error once the installer has started puts the boot
// state back as it was before, so the next boot stays on the running slot.
func (m *machine) installSlot(root, slot, version string, preserve bool) error {
	bootDir := filepath.Join(upgradeWork, "boot")
	if err := os.MkdirAll(bootDir, 0o700); err != nil {
		return err
	}
	flags := uintptr(syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC)
	if err := syscall.Mount(m.slots.device, bootDir, "vfat", flags, bootMountOptions()); err != nil {
		return fmt.Errorf("mount BOOT %s for the installer: %v", m.slots.device, err)
	}
	defer func() {
		syscall.Sync()
		if err := syscall.Unmount(bootDir, 0); err != nil {
			_ = syscall.Unmount(bootDir, syscall.MNT_DETACH)
		}
	}()
	env := filepath.Join(bootDir, "grub", "grubenv")
	return guardBootState(env, slot, version, func() error { return m.runInstaller(root, bootDir, slot) }, func() error {
		if preserve {
			return nil
		}
		ephemeral := m.volume().Var
		if err := wipeSignatures(ephemeral); err != nil {
			return fmt.Errorf("preserve false: wiping EPHEMERAL %s: %v", ephemeral, err)
		}
		m.con.printf("upgrade: preserve false: EPHEMERAL %s will be formatted on the next boot", ephemeral)
		return nil
	})
}

// guardBootState runs install (which writes a slot and puts it on trial in the boot state at
// env), checks that the state it left is exactly that trial, then runs after. When any of them
// fails, the state read before install is written back: whatever install wrote, the next boot
// boots what it would have booted before.
func guardBootState(env, slot, version string, install, after func() error) error {
	before, err := bootstate.Read(env)
	if err != nil {
		return fmt.Errorf("the boot state before the install: %v", err)
	}
	grub := filepath.Dir(env)
	menu, err := readGrubDir(grub)
	if err != nil {
		return fmt.Errorf("BOOT's grub directory before the install: %v", err)
	}
	err = install()
	if merr := checkGrubDir(grub, menu); merr != nil && err == nil {
		err = merr
	}
	if err == nil {
		err = checkTrial(before, env, slot, version)
	}
	if err == nil && after != nil {
		err = after()
	}
	if err == nil {
		return nil
	}
	if rerr := restoreGrubDir(grub, menu); rerr != nil {
		return fmt.Errorf("%v; putting BOOT's grub directory back failed too: %v", err, rerr)
	}
	if rerr := restoreBootState(env, before); rerr != nil {
		return fmt.Errorf("%v; putting the boot state back failed too: %v", err, rerr)
	}
	return fmt.Errorf("%v (the boot state is as it was: the next boot stays on slot %s)", err, before.Default)
}

// checkTrial: the installer must have put slot on trial with version, and changed nothing else
// (the default slot is what GRUB falls back to).
func checkTrial(before bootstate.State, env, slot, version string) error {
	after, err := bootstate.Read(env)
	if err != nil {
		return fmt.Errorf("the installer left no boot state Kiln can read: %v", err)
	}
	switch {
	case after.Default != before.Default:
		return fmt.Errorf("the installer made slot %q the default instead of leaving %s", after.Default, before.Default)
	case after.Next != slot || after.Tries < 1 || after.Tries > defaultTries:
		return fmt.Errorf("the installer did not put slot %s on trial (next %q, %d tries)", slot, after.Next, after.Tries)
	case after.Versions[slot] != version:
		return fmt.Errorf("the installer recorded version %q for slot %s, not %s", after.Versions[slot], slot, version)
	case after.Versions[before.Default] != before.Versions[before.Default]:
		return fmt.Errorf("the installer changed the version recorded for slot %s", before.Default)
	}
	return nil
}

// grubDirEntries and grubFileMax bound what readGrubDir keeps of BOOT's grub directory (the
// menu is a few KiB).
const (
	grubDirEntries = 64
	grubFileMax    = 4 << 20
)

// readGrubDir reads the regular files of BOOT's grub directory but the boot state (grub.cfg,
// the menu, and whatever else the image put there); a subdirectory is kept by name only.
func readGrubDir(dir string) (map[string][]byte, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	if len(ents) > grubDirEntries {
		return nil, fmt.Errorf("%d entries, more than %d", len(ents), grubDirEntries)
	}
	files := map[string][]byte{}
	for _, e := range ents {
		switch name := e.Name(); {
		case name == "grubenv":
		case e.IsDir():
			files[name+"/"] = nil
		case e.Type().IsRegular():
			b, err := safefile.ReadFile(filepath.Join(dir, name), grubFileMax)
			if err != nil {
				return nil, err
			}
			files[name] = b
		default:
			return nil, fmt.Errorf("%s is not a regular file", name)
		}
	}
	return files, nil
}

// checkGrubDir: the installer may replace the boot state (checkTrial checks it) and nothing else
// in BOOT's grub directory; a leftover grubenv.new is tolerated.
func checkGrubDir(dir string, before map[string][]byte) error {
	after, err := readGrubDir(dir)
	if err != nil {
		return fmt.Errorf("BOOT's grub directory after the installer: %v", err)
	}
	delete(after, "grubenv.new")
	for name, b := range before {
		a, ok := after[name]
		if !ok || string(a) != string(b) {
			return fmt.Errorf("the installer changed grub/%s on BOOT, which it may not", name)
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			return fmt.Errorf("the installer added grub/%s on BOOT, which it may not", name)
		}
	}
	return nil
}

// restoreGrubDir puts the files readGrubDir read back as they were and removes any the
// installer added (but the boot state, which restoreBootState puts back).
func restoreGrubDir(dir string, before map[string][]byte) error {
	after, err := readGrubDir(dir)
	if err != nil {
		return err
	}
	for name := range after {
		if _, ok := before[name]; !ok && !strings.HasSuffix(name, "/") {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	for name, b := range before {
		if strings.HasSuffix(name, "/") || string(after[name]) == string(b) {
			continue
		}
		if err := persist.WriteFileAtomic(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// restoreBootState writes st back (atomically, as every boot state write), unless the block
// already says exactly that.
func restoreBootState(env string, st bootstate.State) error {
	want, err := st.Encode()
	if err != nil {
		return err
	}
	if have, err := os.ReadFile(env); err == nil && string(have) == string(want) {
		return nil
	}
	if err := bootstate.Write(env, st); err != nil {
		return err
	}
	syscall.Sync()
	return nil
}

// installerCommand is the sandbox helper running the image's installer for slot, BOOT at /boot;
// pause is kiln.test=pause:STEP's step for the power-cut tests, normally "".
func installerCommand(root, bootDir, slot, pause string) *exec.Cmd {
	args := []string{"install", "--upgrade", "--boot-dir", "/boot", "--slot", slot, "--tries", fmt.Sprint(defaultTries)}
	if pause != "" {
		args = append(args, "--test-pause-after", pause)
	}
	cmd := exec.Command(sandboxExe, sandboxArgs(root, bootDir, []string{slot, "grub"}, "/usr/bin/installer", args...)...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: sandboxFlags, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// runInstaller runs the image's machined in the sandbox (upgrade_sandbox.go): the image read-only
// as its root, BOOT its only writable filesystem, no device nodes, no capabilities.
func (m *machine) runInstaller(root, bootDir, slot string) error {
	if err := prepareSandboxRoot(root); err != nil {
		return err
	}
	// the slot's directory must exist to be bound writable (BOOT is vfat: no links)
	if err := os.MkdirAll(filepath.Join(bootDir, slot), 0o700); err != nil {
		return fmt.Errorf("slot %s on BOOT: %v", slot, err)
	}
	cmd := installerCommand(root, bootDir, slot, pauseStep(m.params))
	out, done, err := supervisor.Children().StartPiped(cmd)
	if err != nil {
		return fmt.Errorf("starting the installer: %v", err)
	}
	var last string
	lines := make(chan struct{})
	safego.Go("installer output", func() {
		defer close(lines)
		scan := bufio.NewScanner(io.LimitReader(out, 1<<20))
		for scan.Scan() {
			last = scan.Text()
			m.con.printf("upgrade: %s", last)
		}
		_, _ = io.Copy(io.Discard, out)
	})
	var status syscall.WaitStatus
	select {
	case status = <-done:
	case <-time.After(installerTimeout):
		_ = cmd.Process.Kill()
		status = <-done
	}
	out.Close()
	<-lines
	if !status.Exited() || status.ExitStatus() != 0 {
		return fmt.Errorf("the installer failed (%s): %s", supervisor.DescribeExit(status), last)
	}
	return nil
}

// wipeSignatures zeroes the first MiB of a partition, so the next boot finds no filesystem
// there and formats it (preserve: false).
func wipeSignatures(dev string) error {
	if dev == "" || dev == "tmpfs" {
		return nil
	}
	f, err := os.OpenFile(dev, os.O_WRONLY|syscall.O_EXCL, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, 1<<20), 0); err != nil {
		return err
	}
	return f.Sync()
}

// upgradeJSON decodes a request body strictly: an unknown field is a mistake worth a 400.
func upgradeJSON(body io.Reader) (upgradeRequest, error) {
	var req upgradeRequest
	dec := json.NewDecoder(io.LimitReader(body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("upgrade request: %v", err)
	}
	return req, nil
}
