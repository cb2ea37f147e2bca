package main

// The signature policy of upgrades: no upgrade installs an unsigned image unless the machine
// config says so by name (allow_unsigned: true), and one that does is called unsigned in the
// status and the log. docs/upgrades.md ("Signed releases") says the same for users.

import (
	"context"
	"errors"
	"fmt"

	"kiln/machined/internal/oci"
)

// errNoReleaseKeys is the refusal of an upgrade on a machine whose config neither trusts a
// release key nor allows unsigned images; it says how to configure either.
var errNoReleaseKeys = errors.New("upgrades are refused: the machine config has no release_keys to check an image's " +
	"signature with; add the public release key (release_keys: the PEM of release.pub from the key directory " +
	"`kiln release push --sign KEYDIR` signs with), or set allow_unsigned: true to install images nobody signed")

// checkUpgradePolicy refuses settings that contradict each other or cannot be honoured.
func (c *Config) checkUpgradePolicy() error {
	if c.RequireSignatures == nil {
		return nil
	}
	switch {
	case *c.RequireSignatures && c.AllowUnsigned:
		return errors.New("require_signatures: true and allow_unsigned: true contradict each other")
	case *c.RequireSignatures && len(c.ReleaseKeys) == 0:
		return errors.New("require_signatures: true needs release_keys to check signatures with")
	case !*c.RequireSignatures && !c.AllowUnsigned:
		return errors.New("require_signatures: false needs allow_unsigned: true as well: unsigned upgrades are allowed only by name")
	}
	return nil
}

// unsignedAllowed: the config lets an upgrade go on without a valid signature by a release key.
func (c *Config) unsignedAllowed() bool { return c != nil && c.AllowUnsigned }

// upgradePolicy refuses, before anything is fetched, an upgrade that could only be unsigned
// and is not allowed to be.
func (m *machine) upgradePolicy() error {
	cfg := m.runningConfig() // a config applied over the API changes the policy at once
	if cfg != nil && len(cfg.ReleaseKeys) > 0 {
		return nil
	}
	if cfg.unsignedAllowed() {
		return nil
	}
	return errNoReleaseKeys
}

// checkSignature verifies the image's signature by one of the config's release keys and returns
// the key's fingerprint. It returns "" (unsigned) without an error only when the config allows
// unsigned images and there is no signature to check (no keys, or no signature tag); a signature
// that is there but not good is refused even then.
func (m *machine) checkSignature(ctx context.Context, src oci.Source, digest string) (string, error) {
	cfg := m.runningConfig()
	if cfg == nil || len(cfg.ReleaseKeys) == 0 {
		if !cfg.unsignedAllowed() {
			return "", errNoReleaseKeys
		}
		m.con.printf("upgrade: UNSIGNED: %s is installed without a signature check (no release_keys, allow_unsigned: true)", digest)
		return "", nil
	}
	keys, err := cfg.releaseKeys()
	if err != nil {
		return "", err
	}
	v, err := oci.VerifySignature(ctx, src, digest, keys)
	if errors.Is(err, oci.ErrNoTag) && cfg.unsignedAllowed() {
		m.con.printf("upgrade: UNSIGNED: %s has no signature; installed anyway (allow_unsigned: true)", digest)
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if v.Legacy {
		m.con.printf("upgrade: signature of %s by release key %s, in the first Kiln signature format, which machined "+
			"refuses from Kiln %s: re-sign the image with kiln release push --sign KEYDIR", digest, v.Signer, oci.LegacySignatureUntil)
		return v.Signer, nil
	}
	m.con.printf("upgrade: signature of %s by release key %s", digest, v.Signer)
	return v.Signer, nil
}

// signatureNote is how the status line names a check's outcome.
func signatureNote(signer string) string {
	if signer == "" {
		return "unsigned"
	}
	return fmt.Sprintf("signed by %s", signer)
}
