"""Template variables: built-ins per platform, vars.yaml files and --set overrides."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln import __version__
from kiln.core.errors import InputError, Location
from kiln.core.yamlfile import read_yaml_file

ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}

# A fixed default so keys and outputs never depend on the clock (2024-01-01T00:00:00Z).
DEFAULT_SOURCE_DATE_EPOCH = 1704067200

# `jobs` renders as a shell reference the runner fills at build time, so cache keys
# stay the same on machines with different core counts.
JOBS_REFERENCE = "${KILN_JOBS}"
DEFAULT_PLATFORM = "linux/amd64"  # without profiles and without --platform


@dataclass(frozen=True)
class Platform:
    os: str
    arch: str

    @property
    def carch(self) -> str:
        return ARCHES[self.arch]

    @property
    def triple(self) -> str:
        return f"{self.carch}-kiln-linux-musl"

    def __str__(self) -> str:
        return f"{self.os}/{self.arch}"

    @classmethod
    def parse(cls, text: str) -> Platform:
        os_name, _, arch = text.partition("/")
        if os_name != "linux" or arch not in ARCHES:
            choices = ", ".join(f"linux/{a}" for a in ARCHES)
            raise InputError(f"unsupported platform {text!r}: choose one of {choices}")
        return cls(os_name, arch)


def host_platform() -> Platform:
    """The platform of this machine: what every build root runs as (builds cross-compile from it)."""
    machine = os.uname().machine
    for arch, carch in ARCHES.items():
        if carch == machine:
            return Platform("linux", arch)
    raise InputError(f"Kiln builds on x86_64 or aarch64 hosts, not {machine}")


def builtins(platform: Platform, build: Platform | None = None) -> dict[str, Any]:
    """Variables every template sees before any vars.yaml.

    `arch`, `carch` and `target` name the platform the output runs on; `build_arch` and
    `build_carch` the machine that builds it; `cross` is true when they differ.
    """
    build = build or platform
    return {
        "arch": platform.arch,
        "carch": platform.carch,
        "target": platform.triple,
        "build_arch": build.arch,
        "build_carch": build.carch,
        "cross": build != platform,
        "os": platform.os,
        "platform": str(platform),
        "jobs": JOBS_REFERENCE,
        "source_date_epoch": DEFAULT_SOURCE_DATE_EPOCH,
        "kiln_version": __version__,
        "toolchain": "toolchain",
    }


def load_vars_file(path: Path, within: Path | None = None) -> dict[str, Any]:
    """A vars.yaml: a mapping of names to values, or nothing."""
    parsed = read_yaml_file(path, what="vars file", within=within)
    if parsed.value is None:
        return {}
    if not isinstance(parsed.value, dict):
        raise InputError("vars file must be a mapping of names to values", Location(str(path), 1))
    for key in parsed.value:
        if not isinstance(key, str) or not key.isidentifier():
            raise InputError(f"variable name {key!r} is not an identifier", Location(str(path), parsed.line((key,))))
    return dict(parsed.value)


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """`--set key=value` pairs; values stay strings (documented)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise InputError(f"--set expects key=value with an identifier key, got {pair!r}")
        out[key] = value
    return out
