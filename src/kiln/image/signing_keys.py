"""Which key directory a profile signs with: `kiln image --keys`, else the profile's `keys:`.

The directory is the user's (kiln keys generate); only its certificates' digests enter the
outputs' seeds, never a private key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from kiln.core.errors import InputError
from kiln.image.profile import KeysRef, Profile
from kiln.signing.keyset import KeySet
from kiln.signing.modules import ModuleSigner


def resolve_keys(profile: Profile, override: Path | None, environ: Mapping[str, str] = os.environ) -> KeySet | None:
    """The profile's key set, or None when it names none; InputError at the profile's line otherwise."""
    if override is not None:
        return _checked(override, f"--keys {override}", None, profile)
    ref = profile.keys
    if ref is None:
        if profile.secureboot:
            raise InputError(
                "secureboot needs signing keys: add keys: {path: DIR} or {env: VAR}, or pass --keys DIR "
                "(kiln keys generate DIR makes them)",
                profile.location("secureboot"),
            )
        return None
    if ref.env is not None:
        value = environ.get(ref.env, "")
        if not value:
            raise InputError(
                f"keys.env: ${ref.env} is not set (it should name a key directory)", profile.location("keys", "env")
            )
        return _checked(Path(value), f"${ref.env} ({value})", ("keys", "env"), profile)
    assert ref.path is not None
    return _checked(ref.path, f"keys.path {ref.path}", ("keys", "path"), profile)


def _checked(root: Path, what: str, field: tuple[str, ...] | None, profile: Profile) -> KeySet:
    where = profile.location(*field) if field else None
    if not root.is_dir():
        raise InputError(f"{what}: no such key directory", where)
    return KeySet(root)


def with_keys(profiles: list[Profile], override: Path | None) -> list[Profile]:
    """The profiles with `kiln image --keys` in place of their own keys, each checked now, before a
    long build, so a missing key directory or unset variable fails at once."""
    if override is not None:
        profiles = [replace(profile, keys=KeysRef(path=override)) for profile in profiles]
    for profile in profiles:
        resolve_keys(profile, None)
    return profiles


def boot_chain_keys(profile: Profile) -> KeySet | None:
    """The keys the boot chain is signed with: a Secure Boot output's or a UKI's; None for the rest
    (their keys, if any, sign only the release's SHA256SUMS)."""
    return resolve_keys(profile, None) if profile.signed_boot else None


def module_signer(profile: Profile) -> ModuleSigner | None:
    """What signs the kernel's and the extensions' modules: the module key of a profile whose boot
    chain is signed (its kernel runs under lockdown and loads only signed modules); None otherwise."""
    keys = boot_chain_keys(profile)
    return ModuleSigner.from_keys(keys) if keys else None
