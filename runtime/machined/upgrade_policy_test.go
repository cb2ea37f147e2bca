package main

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"

	"kiln/machined/internal/oci"
)

func boolPtr(b bool) *bool { return &b }

func TestUpgradePolicyInTheConfig(t *testing.T) {
	key := releaseKeyPEM(t, seededKey(1).Public().(ed25519.PublicKey))
	for name, tc := range map[string]struct {
		cfg  Config
		want string // "" for a valid config
	}{
		"keys":                            {Config{ReleaseKeys: []string{key}}, ""},
		"keys, required":                  {Config{ReleaseKeys: []string{key}, RequireSignatures: boolPtr(true)}, ""},
		"keys, unsigned allowed":          {Config{ReleaseKeys: []string{key}, AllowUnsigned: true}, ""},
		"no keys, unsigned allowed":       {Config{AllowUnsigned: true}, ""},
		"not required, unsigned allowed":  {Config{RequireSignatures: boolPtr(false), AllowUnsigned: true}, ""},
		"nothing":                         {Config{}, ""}, // valid; upgrades are refused (below)
		"required without keys":           {Config{RequireSignatures: boolPtr(true)}, "require_signatures: true needs release_keys"},
		"required and allowed":            {Config{ReleaseKeys: []string{key}, RequireSignatures: boolPtr(true), AllowUnsigned: true}, "contradict"},
		"not required, but not allowed":   {Config{ReleaseKeys: []string{key}, RequireSignatures: boolPtr(false)}, "needs allow_unsigned: true"},
		"not required, no keys, no allow": {Config{RequireSignatures: boolPtr(false)}, "needs allow_unsigned: true"},
	} {
		js, _ := json.Marshal(tc.cfg)
		_, err := parseConfig("c.json", js, true)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
	c, err := parseConfig("c.yaml", []byte("allow_unsigned: true\nrequire_signatures: false\n"), true)
	if err != nil || !c.AllowUnsigned || c.RequireSignatures == nil || *c.RequireSignatures {
		t.Fatalf("yaml: %+v %v", c, err)
	}
}

func TestUpgradeWithoutReleaseKeysIsRefusedBeforeAnythingIsFetched(t *testing.T) {
	m := &machine{con: quietConsole(), cfg: &Config{}, slots: &slots{slot: "A", device: "/dev/null"}}
	_, err := m.Upgrade(upgradeRequest{Image: "127.0.0.1:1/kiln/installer:1.0.0"})
	ae, ok := err.(*apiError)
	if !ok || ae.code != 409 || !strings.Contains(ae.msg, "release_keys") || !strings.Contains(ae.msg, "allow_unsigned: true") {
		t.Fatalf("no keys: %v", err)
	}
	if m.upgrades.snapshot() != nil {
		t.Fatal("an upgrade started")
	}
	// a machine without an A/B disk says the same: the policy is what its config must change
	diskless := &machine{con: quietConsole(), cfg: &Config{}}
	if _, err := diskless.Upgrade(upgradeRequest{Image: "127.0.0.1:1/kiln/installer:1.0.0"}); err == nil || !strings.Contains(err.Error(), "release_keys") {
		t.Fatalf("diskless, no keys: %v", err)
	}
}

func TestUnsignedUpgradesAreAllowedOnlyByNameAndSaidSo(t *testing.T) {
	ctx := context.Background()
	trusted, stranger := seededKey(1), seededKey(2)
	key := releaseKeyPEM(t, trusted.Public().(ed25519.PublicKey))

	// no keys, allowed: unsigned, and the log says so
	m := &machine{con: quietConsole(), cfg: &Config{AllowUnsigned: true}}
	unreachable := &oci.Registry{Host: "127.0.0.1:1", Repo: "kiln/installer", Insecure: true}
	if signer, err := m.checkSignature(ctx, unreachable, upgradeDigest); signer != "" || err != nil {
		t.Fatalf("allowed, no keys: %q %v", signer, err)
	}
	if lines := m.con.log.Lines(); len(lines) != 1 || !strings.Contains(lines[0], "UNSIGNED") {
		t.Fatalf("logged %q", lines)
	}
	if err := m.upgradePolicy(); err != nil {
		t.Fatal(err)
	}

	// keys and allowed: an image without a signature goes on as unsigned...
	m = &machine{con: quietConsole(), cfg: &Config{ReleaseKeys: []string{key}, AllowUnsigned: true}}
	if signer, err := m.checkSignature(ctx, signatureRegistry(t, map[string][]byte{}), upgradeDigest); signer != "" || err != nil {
		t.Fatalf("allowed, no signature: %q %v", signer, err)
	}
	if lines := m.con.log.Lines(); len(lines) != 1 || !strings.Contains(lines[0], "UNSIGNED") {
		t.Fatalf("logged %q", lines)
	}
	// ...but a signature by another key is refused all the same
	if signer, err := m.checkSignature(ctx, signatureRegistry(t, signedBy(t, upgradeDigest, stranger)), upgradeDigest); err == nil || signer != "" {
		t.Fatalf("allowed, a stranger's signature: %q %v", signer, err)
	}

	// keys, not allowed: no signature is a refusal
	m = &machine{con: quietConsole(), cfg: &Config{ReleaseKeys: []string{key}}}
	if _, err := m.checkSignature(ctx, signatureRegistry(t, map[string][]byte{}), upgradeDigest); err == nil || !strings.Contains(err.Error(), "no signature") {
		t.Fatalf("required, no signature: %v", err)
	}

	b, _ := json.Marshal(upgradeStatus{State: upgradeInstalling, Unsigned: true})
	if !strings.Contains(string(b), `"unsigned":true`) {
		t.Fatalf("status %s", b)
	}
}
