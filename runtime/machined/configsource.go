package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
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
	client := &http.Client{Timeout: 15 * time.Second}
	deadline := time.Now().Add(time.Minute)
	wait := time.Second
	for {
		data, err := fetch(client, value)
		if err == nil {
			return parseConfig(value, data, true)
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

func fetch(client *http.Client, url string) ([]byte, error) {
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 4<<20))
}

// findConfigDrive returns the device holding a filesystem labelled cidata or KILNCFG.
// CD drives report their media a moment after they appear, so empty ones are re-read
// for a few seconds before giving up.
func findConfigDrive(sysRoot string) (dev, fstype string) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		waiting := false
		for _, b := range listBlockDevices(sysRoot) {
			if isVirtualDisk(b.Name) {
				continue
			}
			if b.Sectors == 0 {
				waiting = waiting || strings.HasPrefix(b.Name, "sr")
				continue
			}
			t, label, err := probeFS(b.Path)
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
