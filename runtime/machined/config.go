package main

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"kiln/machined/internal/network"
	"kiln/machined/internal/oci"
	"kiln/machined/internal/supervisor"
	"kiln/machined/internal/yaml"
)

// Config is the machine config (docs/machine-config.md). Every field is optional: an
// empty config means DHCP on every interface, no extra services and the API off.
type Config struct {
	Version  int                      `json:"version,omitempty"`
	Hostname string                   `json:"hostname,omitempty"`
	Install  InstallConfig            `json:"install,omitempty"`
	Network  network.NetworkConfig    `json:"network,omitempty"`
	Services []supervisor.ServiceSpec `json:"services,omitempty"`
	API      APIConfig                `json:"api,omitempty"`
	// Registries says how to reach the registries (and tarball hosts) upgrades pull from.
	Registries []RegistryConfig `json:"registries,omitempty"`
	Time       TimeConfig       `json:"time,omitempty"`
	Health     HealthConfig     `json:"health,omitempty"` // checks a trial slot must pass before it becomes the default
	// ReleaseKeys are the public keys (PEM, PKIX; ECDSA P-256, or Ed25519 for images signed in
	// the first Kiln format) an upgrade's image must be signed by, one of them; without any,
	// upgrades are refused unless AllowUnsigned.
	ReleaseKeys []string `json:"release_keys,omitempty"`
	// RequireSignatures: an upgrade's image must be signed by one of ReleaseKeys. It defaults
	// to on, and can be off only together with AllowUnsigned (upgradePolicy).
	RequireSignatures *bool `json:"require_signatures,omitempty"`
	// AllowUnsigned lets an upgrade install an image without a signature by ReleaseKeys (none
	// there, or no keys at all); status and log then say "unsigned". A signature that is there
	// but wrong is refused all the same.
	AllowUnsigned bool `json:"allow_unsigned,omitempty"`
}

// TimeConfig names the NTP servers; without them the platform's (a cloud's own time service)
// or DHCP's (option 42) are used.
type TimeConfig struct {
	Servers  []string `json:"servers,omitempty"`  // HOST or HOST:PORT
	Disabled bool     `json:"disabled,omitempty"` // keep the clock as the firmware set it
}

// RegistryConfig is one host's trust: its CA (PEM) for https, or plain http when insecure.
type RegistryConfig struct {
	Host     string `json:"host"`               // HOST[:PORT], as in image references
	CA       string `json:"ca,omitempty"`       // PEM; without it the system's roots are used
	Insecure bool   `json:"insecure,omitempty"` // plain http: for a registry on a trusted network only
}

var registryHostRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})(:[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?$`)

// InstallConfig names the disk machined owns (STATE and EPHEMERAL go there).
type InstallConfig struct {
	Disk       string `json:"disk,omitempty"`       // /dev/vda, /dev/nvme0n1, ...
	Filesystem string `json:"filesystem,omitempty"` // of EPHEMERAL (/var): ext4 (default) or xfs
}

// APIConfig holds PEM text: the server's certificate and key, and the CA that signs clients
// (client_ca; ca is its older name). api_auth.go builds the TLS from it.
type APIConfig struct {
	Listen   string `json:"listen,omitempty"` // default :50000
	ClientCA string `json:"client_ca,omitempty"`
	CA       string `json:"ca,omitempty"`
	Cert     string `json:"cert,omitempty"`
	Key      string `json:"key,omitempty"`
}

func (a APIConfig) Enabled() bool {
	return a.ClientCA != "" || a.CA != "" || a.Cert != "" || a.Key != ""
}

// isJSON: a config whose first significant character opens an object is JSON.
func isJSON(data []byte) bool {
	trimmed := bytes.TrimLeft(data, " \t\r\n\ufeff")
	return len(trimmed) > 0 && trimmed[0] == '{'
}

// decodeDocument decodes YAML (the subset) or JSON into v. Strict decoding refuses unknown
// fields, so a typo ("hostnme") is an error rather than a silently ignored setting.
func decodeDocument(name string, data []byte, v interface{}, strict bool) error {
	if len(data) > yaml.MaxSize {
		return fmt.Errorf("%s: %d bytes is more than the %d a config may have", name, len(data), yaml.MaxSize)
	}
	if !isJSON(data) {
		tree, err := yaml.Parse(name, data)
		if err != nil {
			return err
		}
		if tree == nil {
			tree = map[string]interface{}{}
		}
		if data, err = json.Marshal(tree); err != nil {
			return fmt.Errorf("%s: %v", name, err)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %s", name, strings.TrimPrefix(err.Error(), "json: "))
	}
	if dec.More() {
		return fmt.Errorf("%s: more than one JSON document", name)
	}
	return nil
}

// parseConfig decodes and validates a machine config. NoCloud user-data is decoded
// leniently (strict=false) because it may carry cloud-init keys meant for other tools.
func parseConfig(name string, data []byte, strict bool) (*Config, error) {
	var c Config
	if err := decodeDocument(name, data, &c, strict); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	return &c, nil
}

var hostnameRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$`)

func (c *Config) validate() error {
	if c.Version != 0 && c.Version != 1 {
		return fmt.Errorf("version %d is not supported (1 is)", c.Version)
	}
	if c.Hostname != "" && (len(c.Hostname) > 253 || !hostnameRE.MatchString(c.Hostname)) {
		return fmt.Errorf("hostname %q is not a valid host name", c.Hostname)
	}
	if d := c.Install.Disk; d != "" && !strings.HasPrefix(d, "/dev/") {
		return fmt.Errorf("install.disk %q: want a device path such as /dev/vda", d)
	}
	switch c.Install.Filesystem {
	case "", "ext4", "xfs":
	default:
		return fmt.Errorf("install.filesystem %q: want ext4 or xfs", c.Install.Filesystem)
	}
	if err := c.Network.Validate(); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i := range c.Services {
		s := &c.Services[i]
		if err := s.Validate(); err != nil {
			return fmt.Errorf("services[%d]: %v", i, err)
		}
		if seen[s.Name] {
			return fmt.Errorf("services: %q is defined twice", s.Name)
		}
		seen[s.Name] = true
	}
	hosts := map[string]bool{}
	for i, server := range c.Time.Servers {
		if !registryHostRE.MatchString(server) {
			return fmt.Errorf("time.servers[%d]: %q: want HOST or HOST:PORT", i, server)
		}
	}
	for i, r := range c.Registries {
		switch {
		case !registryHostRE.MatchString(r.Host):
			return fmt.Errorf("registries[%d]: host %q: want HOST[:PORT]", i, r.Host)
		case hosts[r.Host]:
			return fmt.Errorf("registries: %q is listed twice", r.Host)
		case r.CA != "" && !x509.NewCertPool().AppendCertsFromPEM([]byte(r.CA)):
			return fmt.Errorf("registries[%d]: ca holds no PEM certificate", i)
		}
		hosts[r.Host] = true
	}
	if _, err := c.releaseKeys(); err != nil {
		return err
	}
	if err := c.Health.validate(); err != nil {
		return err
	}
	if err := c.checkUpgradePolicy(); err != nil {
		return err
	}
	if c.API.Enabled() {
		if _, err := c.API.tlsConfig(); err != nil {
			return fmt.Errorf("api: %v", err)
		}
	}
	return nil
}

// releaseKeys parses release_keys: each an ECDSA P-256 or Ed25519 public key in PEM, at most 16.
func (c *Config) releaseKeys() ([]crypto.PublicKey, error) {
	if len(c.ReleaseKeys) > oci.MaxTrustedKeys {
		return nil, fmt.Errorf("release_keys: %d keys, at most %d are allowed", len(c.ReleaseKeys), oci.MaxTrustedKeys)
	}
	var keys []crypto.PublicKey
	for i, text := range c.ReleaseKeys {
		k, err := oci.ParsePublicKeyPEM(text)
		if err != nil {
			return nil, fmt.Errorf("release_keys[%d]: %v", i, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}
