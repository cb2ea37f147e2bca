package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"kiln/machined/internal/disk"
	"kiln/machined/internal/redact"
	"kiln/machined/internal/safefile"
)

const cidataMount = "/run/kiln/cidata"

// configLabels are the filesystem labels of config drives: NoCloud's cidata (vfat labels
// read upper-case) and Kiln's own KILNCFG.
var configLabels = []string{"cidata", "kilncfg"}

// configFiles are read from a config drive in this order; the first one present wins.
// user-data is NoCloud's; it is read leniently since it may carry cloud-init keys.
var configFiles = []struct {
	name   string
	strict bool
}{{"kiln.yaml", true}, {"kiln.yml", true}, {"kiln.json", true}, {"user-data", false}}

func isURL(s string) bool { return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") }

// configSourceName is kiln.config='s value as status and the console show it: a path as it is,
// a URL redacted (no credentials, no query).
func configSourceName(value string) string {
	if isURL(value) {
		return redact.String(value)
	}
	return value
}

// maxRemoteConfig bounds a fetched config: a config is a few KiB, a hostile server may send GiBs.
// A config drive's files and the kept config are bounded the same.
const maxRemoteConfig = 1 << 20

// maxMetaData bounds NoCloud's meta-data, which gives no more than a hostname here.
const maxMetaData = 64 << 10

// remoteConfig is a kiln.config= URL made safe to fetch: the config defines root services and
// the API's CA, so it must come over https (verified against the rootfs's CA bundle) or carry
// a "#sha256=<hex>" digest the fetched bytes must match; plain http without one is refused.
type remoteConfig struct {
	url    string // without the fragment
	digest []byte // nil: https, trusted through its certificate
}

func parseRemoteConfig(value string) (remoteConfig, error) {
	u, err := url.Parse(value)
	if err != nil || u.Host == "" {
		return remoteConfig{}, fmt.Errorf("kiln.config=%q is not a URL", redact.String(value))
	}
	var digest []byte
	if u.Fragment != "" {
		hexDigest := strings.TrimPrefix(u.Fragment, "sha256=")
		digest, err = hex.DecodeString(hexDigest)
		if hexDigest == u.Fragment || err != nil || len(digest) != sha256.Size {
			return remoteConfig{}, fmt.Errorf("kiln.config: fragment %q is not sha256=<64 hex digits>", u.Fragment)
		}
		u.Fragment = ""
	}
	if u.Scheme == "http" && digest == nil {
		return remoteConfig{}, errors.New("kiln.config: plain http is refused (the config holds root services " +
			"and the API CA): use https, or add #sha256=<digest of the file> to the URL")
	}
	return remoteConfig{url: u.String(), digest: digest}, nil
}

// configFromParam reads kiln.config=<path|URL>. URLs are retried for a minute: the
// network may still be settling (DHCP, a config server booting alongside). A URL shows in
// errors and on the console only redacted (no userinfo, no query: redact.String).
func configFromParam(value string, say func(string, ...interface{})) (*Config, error) {
	if !isURL(value) {
		data, err := readBounded(value, maxRemoteConfig)
		if err != nil {
			return nil, err
		}
		return parseConfig(value, data, true)
	}
	remote, err := parseRemoteConfig(value)
	if err != nil {
		return nil, err
	}
	client := configClient(remote)
	deadline := time.Now().Add(time.Minute)
	wait := time.Second
	for {
		data, err := fetch(client, remote)
		if err == nil {
			return parseConfig(redact.String(remote.url), data, true)
		}
		err = redact.Error(err)
		if time.Now().After(deadline) {
			return nil, err
		}
		say("config: %v; retrying in %s", err, wait)
		time.Sleep(wait)
		if wait < 8*time.Second {
			wait *= 2
		}
	}
}

// readBounded reads a kiln.config= path from the booted root: the image's own files, so links
// are followed, but only to a regular file and only up to max bytes.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if info, err := f.Stat(); err != nil || !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	data, err := safefile.ReadAtMost(f, max)
	if errors.Is(err, safefile.ErrTooLarge) {
		return nil, fmt.Errorf("%s: more than %d bytes", path, max)
	}
	return data, err
}

// configClient follows at most 3 redirects, and never from https to http unless a digest
// pins the bytes anyway.
func configClient(remote remoteConfig) *http.Client {
	return &http.Client{
		Timeout: 15 * time.Second,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 3 {
				return errors.New("too many redirects")
			}
			if req.URL.Scheme != "https" && remote.digest == nil {
				return fmt.Errorf("redirect to %s refused: not https", req.URL.Scheme)
			}
			return nil
		},
	}
}

func fetch(client *http.Client, remote remoteConfig) ([]byte, error) {
	resp, err := client.Get(remote.url)
	if err != nil {
		return nil, redact.Error(err) // net/http's errors quote the URL, query and all
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", redact.String(remote.url), resp.Status)
	}
	data, err := safefile.ReadAtMost(resp.Body, maxRemoteConfig)
	if errors.Is(err, safefile.ErrTooLarge) {
		return nil, fmt.Errorf("GET %s: larger than %d bytes", redact.String(remote.url), maxRemoteConfig)
	}
	if err != nil {
		return nil, err
	}
	if remote.digest != nil {
		sum := sha256.Sum256(data)
		if !bytes.Equal(sum[:], remote.digest) {
			return nil, fmt.Errorf("GET %s: sha256 %x does not match the URL's digest", redact.String(remote.url), sum)
		}
	}
	return data, nil
}

// findConfigDrive returns the device holding a filesystem labelled cidata or KILNCFG.
// CD drives report their media a moment after they appear, so empty ones are re-read
// for a few seconds before giving up.
func findConfigDrive(sysRoot string) (dev, fstype string) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		waiting := false
		for _, b := range disk.ListBlockDevices(sysRoot) {
			if disk.IsVirtualDisk(b.Name) {
				continue
			}
			if b.Sectors == 0 {
				waiting = waiting || strings.HasPrefix(b.Name, "sr")
				continue
			}
			t, label, err := disk.ProbeFS(b.Path)
			if err != nil || t == "" {
				continue
			}
			for _, want := range configLabels {
				if strings.EqualFold(label, want) {
					return b.Path, t
				}
			}
		}
		if !waiting || time.Now().After(deadline) {
			return "", ""
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// configFromDrive mounts a config drive read-only, reads the config from it and unmounts
// it. meta-data's local-hostname fills in the hostname when the config has none.
func configFromDrive(dev, fstype string) (*Config, string, error) {
	if err := os.MkdirAll(cidataMount, 0o755); err != nil {
		return nil, "", err
	}
	if err := syscall.Mount(dev, cidataMount, fstype, syscall.MS_RDONLY|syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return nil, "", fmt.Errorf("mount %s (%s): %v", dev, fstype, err)
	}
	defer syscall.Unmount(cidataMount, 0)
	return configFromDir(cidataMount, dev)
}

// configFromDir reads a config drive's files (a mounted drive, or a directory in tests), each
// through safefile: regular files only, never through a link, at most maxRemoteConfig bytes.
// A file that is there but refused is an error, not a reason to try the next one.
func configFromDir(dir, dev string) (*Config, string, error) {
	for _, f := range configFiles {
		source := dev + ":" + f.name
		data, err := safefile.ReadUnder(dir, f.name, maxRemoteConfig)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, source, fmt.Errorf("%s: %w", dev, err)
		}
		cfg, err := parseConfig(source, data, f.strict)
		if err != nil {
			return nil, source, err
		}
		if cfg.Hostname == "" {
			cfg.Hostname = metaDataHostname(dir)
		}
		return cfg, source, nil
	}
	return nil, dev, fmt.Errorf("%s has none of kiln.yaml, kiln.json or user-data", dev)
}

// metaDataHostname reads NoCloud's meta-data (YAML or JSON) on the drive at dir for
// local-hostname; a missing, refused or unreadable file gives none.
func metaDataHostname(dir string) string {
	data, err := safefile.ReadUnder(dir, "meta-data", maxMetaData)
	if err != nil {
		return ""
	}
	var meta struct {
		LocalHostname string `json:"local-hostname"`
	}
	if decodeDocument("meta-data", data, &meta, false) != nil || !hostnameRE.MatchString(meta.LocalHostname) {
		return ""
	}
	return meta.LocalHostname
}
