package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"reflect"
	"strings"
	"testing"

	"kiln/machined/internal/network"
	"kiln/machined/internal/supervisor"
)

const exampleYAML = `# a machine config
version: 1
hostname: node-1
install:
  disk: /dev/vda
  filesystem: xfs
network:
  interfaces:
    - name: eth0              # DHCP
    - name: eth1
      addresses: [192.168.10.5/24, "10.0.0.5/8"]
      gateway: 192.168.10.1
  nameservers:
  - 1.1.1.1
  - 9.9.9.9
services:
  - name: web
    command: /usr/local/bin/web
    args: ["--port", "8080", 'it''s']
    env:
      PORT: 8080
      DEBUG: true
      GREETING: "hello\tworld"
    restart: always
    after: [db]
  - name: db
    command: /usr/local/bin/db
    restart: on-failure
api:
  listen: ":50000"
`

func TestParseYAMLConfig(t *testing.T) {
	cfg, err := parseConfig("kiln.yaml", []byte(exampleYAML), true)
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Version:  1,
		Hostname: "node-1",
		Install:  InstallConfig{Disk: "/dev/vda", Filesystem: "xfs"},
		Network: network.NetworkConfig{
			Interfaces: []network.InterfaceConfig{
				{Name: "eth0"},
				{Name: "eth1", Addresses: []string{"192.168.10.5/24", "10.0.0.5/8"}, Gateway: "192.168.10.1"},
			},
			Nameservers: []string{"1.1.1.1", "9.9.9.9"},
		},
		Services: []supervisor.ServiceSpec{
			{Name: "web", Command: "/usr/local/bin/web", Args: []string{"--port", "8080", "it's"},
				Env: supervisor.StringMap{"PORT": "8080", "DEBUG": "true", "GREETING": "hello\tworld"}, Type: "simple", Restart: "always", After: []string{"db"}},
			{Name: "db", Command: "/usr/local/bin/db", Type: "simple", Restart: "on-failure"},
		},
		API: APIConfig{Listen: ":50000"},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got  %+v\nwant %+v", cfg, want)
	}
	if !cfg.Network.Interfaces[0].UsesDHCP() || cfg.Network.Interfaces[1].UsesDHCP() {
		t.Fatal("eth0 should use DHCP and eth1 not")
	}
}

func TestParseJSONConfigMatchesYAML(t *testing.T) {
	js := `{"version": 1, "hostname": "node-1", "install": {"disk": "/dev/vda", "filesystem": "xfs"},
	 "network": {"interfaces": [{"name": "eth0"}, {"name": "eth1", "addresses": ["192.168.10.5/24", "10.0.0.5/8"], "gateway": "192.168.10.1"}],
	             "nameservers": ["1.1.1.1", "9.9.9.9"]},
	 "services": [{"name": "web", "command": "/usr/local/bin/web", "args": ["--port", "8080", "it's"],
	               "env": {"PORT": 8080, "DEBUG": true, "GREETING": "hello\tworld"}, "restart": "always", "after": ["db"]},
	              {"name": "db", "command": "/usr/local/bin/db", "restart": "on-failure"}],
	 "api": {"listen": ":50000"}}`
	fromJSON, err := parseConfig("kiln.json", []byte(js), true)
	if err != nil {
		t.Fatal(err)
	}
	fromYAML, err := parseConfig("kiln.yaml", []byte(exampleYAML), true)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromJSON, fromYAML) {
		t.Fatalf("JSON and YAML differ:\n%+v\n%+v", fromJSON, fromYAML)
	}
}

func TestConfigValidation(t *testing.T) {
	for doc, want := range map[string]string{
		"hostnme: x\n":                   `unknown field "hostnme"`,
		"hostname: -bad-\n":              "not a valid host name",
		"version: 2\n":                   "version 2",
		"install: {disk: vda}\n":         "want a device path",
		"install: {filesystem: btrfs}\n": "want ext4 or xfs",
		"network: {interfaces: [{name: eth0, addresses: [10.0.0.1]}]}\n": "want a CIDR",
		"network: {interfaces: [{name: eth0, gateway: 10.0.0.1}]}\n":     "needs a static address",
		"network: {nameservers: [dns.example]}\n":                        "not an IP address",
		"services: [{name: a, command: rel/path}]\n":                     "absolute path",
		"services: [{name: a, command: /x, restart: sometimes}]\n":       "want always, on-failure or never",
		"services: [{name: A, command: /x}]\n":                           "service name",
		"services: [{name: a, command: /x}, {name: a, command: /y}]\n":   "defined twice",
		"api: {cert: x}\n":                "all required",
		"api: {ca: x, cert: y, key: z}\n": "cert/key",
		"services: {name: a}\n":           "cannot unmarshal object",
		"time: {servers: [\"a b\"]}\n":    "time.servers[0]",
	} {
		_, err := parseConfig("c.yaml", []byte(doc), true)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "c.yaml") {
			t.Errorf("%q: got %v, want an error containing %q", doc, err, want)
		}
	}
}

func TestEmptyConfigAndLenientUserData(t *testing.T) {
	cfg, err := parseConfig("empty.yaml", []byte("# nothing\n"), true)
	if err != nil || !reflect.DeepEqual(cfg, &Config{}) {
		t.Fatalf("empty config: %+v %v", cfg, err)
	}
	userData := "#cloud-config\nhostname: from-user-data\nssh_authorized_keys: [key]\n"
	if _, err := parseConfig("user-data", []byte(userData), true); err == nil {
		t.Fatal("strict decoding should refuse cloud-init keys")
	}
	cfg, err = parseConfig("user-data", []byte(userData), false)
	if err != nil || cfg.Hostname != "from-user-data" {
		t.Fatalf("lenient user-data: %+v %v", cfg, err)
	}
}

func TestReleaseKeys(t *testing.T) {
	pub := seededKey(1).Public().(ed25519.PublicKey)
	key := releaseKeyPEM(t, pub)
	yamlDoc := "release_keys:\n  - |\n    " + strings.ReplaceAll(strings.TrimSpace(key), "\n", "\n    ") + "\n"
	cfg, err := parseConfig("c.yaml", []byte(yamlDoc), true)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := cfg.releaseKeys()
	if err != nil || len(keys) != 1 || !bytes.Equal(keys[0].(ed25519.PublicKey), pub) {
		t.Fatalf("%x %v", keys, err)
	}
	// the image release key (ECDSA P-256) beside it
	ec := seededECDSA(t, 1)
	both, err := (&Config{ReleaseKeys: []string{key, ecdsaKeyPEM(t, &ec.PublicKey)}}).releaseKeys()
	if err != nil || len(both) != 2 || !ec.PublicKey.Equal(both[1]) {
		t.Fatalf("ECDSA P-256: %v %v", both, err)
	}
	js, _ := json.Marshal(map[string][]string{"release_keys": {key}})
	fromJSON, err := parseConfig("c.json", js, true)
	if err != nil || !reflect.DeepEqual(fromJSON, cfg) {
		t.Fatalf("JSON: %+v %v", fromJSON, err)
	}

	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	rsaDER, _ := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	rsaPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: rsaDER}))
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	many := make([]string, 17)
	for i := range many {
		many[i] = key
	}
	for name, tc := range map[string]struct {
		keys []string
		want string
	}{
		"not PEM":  {[]string{key, "ssh-ed25519 AAAAC3Nza..."}, "release_keys[1]: not a PEM public key"},
		"RSA":      {[]string{rsaPEM}, "release_keys[0]: an RSA key: release keys are ECDSA P-256 or Ed25519"},
		"P-384":    {[]string{ecdsaKeyPEM(t, &p384.PublicKey)}, "release_keys[0]: an ECDSA key not on P-256"},
		"17 keys":  {many, "release_keys: 17 keys, at most 16 are allowed"},
		"cert":     {[]string{strings.ReplaceAll(key, "PUBLIC KEY", "CERTIFICATE")}, `release_keys[0]: PEM block is "CERTIFICATE"`},
		"two in 1": {[]string{key + key}, "release_keys[0]: more than one PEM block"},
	} {
		js, _ := json.Marshal(map[string][]string{"release_keys": tc.keys})
		_, err := parseConfig("c.json", js, true)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "c.json: ") {
			t.Errorf("%s: got %v, want an error containing %q", name, err, tc.want)
		}
	}
	if _, err := parseConfig("c.yaml", []byte("release_keys: [nope]\n"), true); err == nil || !strings.Contains(err.Error(), "release_keys[0]") {
		t.Errorf("YAML: %v", err)
	}
}
