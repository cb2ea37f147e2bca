"""Profiles that sign: `keys:` and `secureboot:` are checked at their lines, and the key directory is
resolved (profile path, environment variable, or `kiln image --keys`) before anything is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.core.errors import InputError
from kiln.image.profile import KeysRef, load_profile
from kiln.image.signing_keys import boot_chain_keys, resolve_keys, with_keys
from tests.unit.test_profiles import messages, write


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages name files relative to the working directory."""
    monkeypatch.chdir(tmp_path)


def test_a_secure_boot_disk_boots_uefi_only_and_names_its_keys(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    profile = load_profile(
        write(
            tmp_path,
            """
            platform: metal
            keys: {path: keys}
            secureboot: true
            output: {kind: image}
            """,
        )
    )
    assert profile.secureboot and profile.firmware == ("uefi",)
    assert profile.keys == KeysRef(path=tmp_path / "keys")
    keys = boot_chain_keys(profile)
    assert keys is not None and keys.root == tmp_path / "keys"


def test_secure_boot_rules_are_reported_at_their_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        platform: metal
        arch: arm64
        secureboot: true
        output:
          kind: pxe
          firmware: [bios, uefi]
        """,
    )
    found = messages(path)
    assert "p.yaml:3: secureboot applies to kinds iso, image, installer, not pxe" in found
    assert "p.yaml:3: secureboot is built for amd64 only so far: arm64 needs systemd's arm64 EFI stub and shim" in found
    assert "p.yaml:6: firmware bios cannot boot securely: drop it (secureboot is UEFI only)" in found


def test_uki_kind_and_keys_schema(tmp_path: Path) -> None:
    assert messages(write(tmp_path, "platform: metal\narch: arm64\noutput: {kind: uki}\n")) == [
        "p.yaml:3: kind uki cannot be built for arm64 yet: it needs systemd's arm64 EFI stub"
    ]
    both = write(tmp_path, "platform: metal\nkeys: {path: a, env: B}\noutput: {kind: uki}\n", "both.yaml")
    assert messages(both) == ["both.yaml:2: keys takes one of path or env"]
    bad_env = write(tmp_path, "platform: metal\nkeys: {env: 'A B'}\noutput: {kind: uki}\n", "env.yaml")
    assert messages(bad_env) == ["env.yaml:2: keys.env 'A B' must be an environment variable name"]


def test_keys_resolve_from_the_environment_and_refuse_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "k").mkdir()
    env_profile = load_profile(write(tmp_path, "platform: metal\nkeys: {env: KILN_KEYS}\noutput: {kind: uki}\n"))
    keys = resolve_keys(env_profile, None, {"KILN_KEYS": str(tmp_path / "k")})
    assert keys is not None and keys.root == tmp_path / "k"
    with pytest.raises(InputError, match=r"p.yaml:2: keys.env: \$KILN_KEYS is not set"):
        resolve_keys(env_profile, None, {})
    with pytest.raises(InputError, match="no such key directory"):
        resolve_keys(env_profile, None, {"KILN_KEYS": str(tmp_path / "absent")})
    missing = load_profile(write(tmp_path, "platform: metal\nkeys: {path: nowhere}\noutput: {kind: uki}\n", "m.yaml"))
    with pytest.raises(InputError, match=r"m.yaml:2: keys.path .*nowhere: no such key directory"):
        resolve_keys(missing, None)


def test_secure_boot_without_keys_fails_before_the_build_and_keys_flag_wins(tmp_path: Path) -> None:
    profile = load_profile(write(tmp_path, "platform: metal\nsecureboot: true\noutput: {kind: image}\n"))
    with pytest.raises(InputError, match=r"p.yaml:2: secureboot needs signing keys"):
        with_keys([profile], None)
    (tmp_path / "flag").mkdir()
    [given] = with_keys([profile], tmp_path / "flag")
    keys = boot_chain_keys(given)
    assert keys is not None and keys.root == tmp_path / "flag"


def test_keys_alone_sign_the_release_but_not_the_boot_chain(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    profile = load_profile(write(tmp_path, "platform: metal\nkeys: {path: keys}\noutput: {kind: image}\n"))
    assert profile.firmware == ("bios", "uefi")
    assert boot_chain_keys(profile) is None
    assert resolve_keys(profile, None) is not None
