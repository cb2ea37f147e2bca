package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"kiln/machined/internal/disk"
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

// maxRemoteConfig bounds a fetched config: a config is a few KiB, a hostile server may send GiBs.
const maxRemoteConfig = 1 << 20

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
		return remoteConfig{}, fmt.Errorf("kiln.config=%q is not a URL", value)
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
// network may still be settling (DHCP, a config server booting alongside).
func configFromParam(value string, say func(string, ...interface{})) (*Config, error) {
	if !isURL(value) {
		data, err := os.ReadFile(value)
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
			return parseConfig(remote.url, data, true)
		}
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
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", remote.url, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxRemoteConfig+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxRemoteConfig {
		return nil, fmt.Errorf("GET %s: larger than %d bytes", remote.url, maxRemoteConfig)
	}
	if remote.digest != nil {
		sum := sha256.Sum256(data)
		if !bytes.Equal(sum[:], remote.digest) {
			return nil, fmt.Errorf("GET %s: sha256 %x does not match the URL's digest", remote.url, sum)
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

// configFromDir reads a config drive's files (a mounted drive, or a directory in tests).
func configFromDir(dir, dev string) (*Config, string, error) {
	for _, f := range configFiles {
		data, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			continue
		}
		source := dev + ":" + f.name
		cfg, err := parseConfig(source, data, f.strict)
		if err != nil {
			return nil, source, err
		}
		if cfg.Hostname == "" {
			cfg.Hostname = metaDataHostname(filepath.Join(dir, "meta-data"))
		}
		return cfg, source, nil
	}
	return nil, dev, fmt.Errorf("%s has none of kiln.yaml, kiln.json or user-data", dev)
}

// metaDataHostname reads NoCloud's meta-data (YAML or JSON) for local-hostname.
func metaDataHostname(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var meta struct {
		LocalHostname string `json:"local-hostname"`
	}
	if decodeDocument(path, data, &meta, false) != nil || !hostnameRE.MatchString(meta.LocalHostname) {
		return ""
	}
	return meta.LocalHostname
}
