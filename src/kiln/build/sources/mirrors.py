"""Where sources are looked for before their upstream URL: kiln-project.yaml's `mirrors:` or $KILN_MIRRORS."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from kiln.core.errors import InputError, InputErrors, KilnError, Location
from kiln.core.project import project_file
from kiln.core.yamlfile import read_yaml_file

MIRRORS_ENV = "KILN_MIRRORS"


MirrorKind = Literal["dir", "http", "debian"]


@dataclass(frozen=True)
class Mirror:
    """Somewhere to look for a source before its upstream URL.

    `dir`: a local directory (location is an absolute path); `http`: a base URL;
    `debian`: Debian's source archive through `apt-get source` (location unused).
    """

    kind: MirrorKind
    location: str = ""

    def __str__(self) -> str:
        return "debian" if self.kind == "debian" else self.location

    @classmethod
    def parse(cls, text: str, base: Path, where: Location | None = None) -> Mirror:
        """One mirror as written in kiln-project.yaml or KILN_MIRRORS; relative paths are taken from `base`."""
        value = text.strip()
        if value in ("debian", "debian:"):
            return cls("debian")
        parts = urlsplit(value)
        scheme = parts.scheme.lower()
        if scheme in ("http", "https"):
            return cls("http", value.rstrip("/"))
        if scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise InputError(f"mirror {value!r}: a file:// URL must name a local path (file:///dir)", where)
            from urllib.request import url2pathname

            return cls("dir", os.path.normpath(url2pathname(parts.path)))
        if not value or "://" in value or value.startswith("debian:"):
            raise InputError(
                f"mirror {value!r} is not a directory, a file://, http:// or https:// URL, or 'debian'", where
            )
        return cls("dir", os.path.normpath(base / os.path.expanduser(value)))


DEFAULT_MIRRORS = (Mirror("debian"),)


def load_mirrors(project_root: Path) -> list[Mirror]:
    """Mirrors from $KILN_MIRRORS if set (even empty), else kiln-project.yaml's `mirrors:`, else [debian].

    The environment wins so CI or one shell can point at a different cache without
    editing the project; an empty KILN_MIRRORS means upstream URLs only.
    """
    configured = os.environ.get(MIRRORS_ENV)
    if configured is not None:
        where = Location(f"${MIRRORS_ENV}")
        return [Mirror.parse(token, Path.cwd(), where) for token in re.split(r"[\s,]+", configured) if token]
    config = project_file(project_root)
    if config is None:
        return list(DEFAULT_MIRRORS)
    return _mirrors_from_file(config, project_root)


def _mirrors_from_file(config: Path, project_root: Path) -> list[Mirror]:
    """The project file's `mirrors:` (absent: the default; null: none), every bad entry reported at its line."""
    file = str(config)
    positioned = read_yaml_file(config, what=config.name)
    data = positioned.value
    if data is None:
        return list(DEFAULT_MIRRORS)
    if not isinstance(data, dict):
        raise InputError(f"{config.name} must be a mapping (for example 'mirrors: [...]')", Location(file, 1))
    if "mirrors" not in data:
        return list(DEFAULT_MIRRORS)
    entries = data["mirrors"]
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise InputError("mirrors must be a list", Location(file, positioned.line(("mirrors",))))
    mirrors: list[Mirror] = []
    errors: list[KilnError] = []
    for index, entry in enumerate(entries):
        where = Location(file, positioned.line(("mirrors", index)))
        if not isinstance(entry, str):
            errors.append(InputError(f"mirror must be a string, not {entry!r}", where))
            continue
        try:
            mirrors.append(Mirror.parse(entry, project_root, where))
        except InputError as exc:
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise InputErrors(errors)
    return mirrors
