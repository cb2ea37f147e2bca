"""Validated package models, built from a rendered pkg.yaml that passed the schema."""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.core.errors import InputError, InputErrors, Location
from kiln.core.yamlfile import Path_, Positioned
from kiln.pkg.paths import name_problem, path_problem

VARIANTS = ("stage0", "toolchain", "scratch")
SNIPPET_PHASES = ("prepare", "build", "install", "test")


@dataclass(frozen=True)
class Source:
    """A remote file pinned by sha256, or a local directory of the project."""

    destination: str
    url: str | None = None
    sha256: str | None = None
    debian: str | None = None
    path: str | None = None
    # Of a local directory: glob patterns (relative to `path`) left out of the copy and the key, such as
    # a build output a developer's own `go build` leaves there. None, not empty, when absent: the
    # canonical spec omits None, so the keys of sources without one stay what they were.
    exclude: tuple[str, ...] | None = None

    @property
    def is_local(self) -> bool:
        return self.path is not None


def excluded(rel: str, patterns: tuple[str, ...]) -> bool:
    """Whether `rel` (a path below a local source, slash-separated) matches one of its `exclude` patterns."""
    return any(fnmatch.fnmatchcase(rel, pattern) for pattern in patterns)


@dataclass(frozen=True)
class Dependency:
    """`stage` is mounted from its `from` at `to` in the dependent's build root."""

    stage: str
    source: str = "/"
    to: str = "/"
    runtime: bool = False


@dataclass(frozen=True)
class Step:
    sources: tuple[Source, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    network: str = "none"
    cache: tuple[str, ...] = ()  # directories kept between builds of the package (kiln.build.buildcache)
    scratch: tuple[str, ...] = ()  # directories that start empty, in memory where the runner can (kiln.build.scratch)
    prepare: tuple[str, ...] = ()
    build: tuple[str, ...] = ()
    install: tuple[str, ...] = ()
    test: tuple[str, ...] = ()

    def snippets(self) -> list[tuple[str, str]]:
        """(phase, script) pairs in the order they run."""
        return [(phase, script) for phase in SNIPPET_PHASES for script in getattr(self, phase)]


@dataclass(frozen=True)
class Finalize:
    source: str
    to: str


@dataclass
class Package:
    """One package of the tree, rendered for one platform."""

    name: str
    variant: str
    file: Path
    spec: dict[str, Any]
    positions: Positioned
    template_line: Any = field(repr=False, default=None)
    description: str = ""
    version: str = ""
    license: str = ""  # an SPDX license expression (checked), for the SBOMs; not part of the key
    cpe: str = ""  # a CPE 2.3 name, for the SBOMs; not part of the key
    dependencies: tuple[Dependency, ...] = ()
    steps: tuple[Step, ...] = ()
    finalize: tuple[Finalize, ...] = ()

    @property
    def directory(self) -> Path:
        return self.file.parent

    def line(self, path: Path_) -> int:
        """Template line of a value in this package's spec."""
        rendered = self.positions.line(path)
        return int(self.template_line(rendered)) if self.template_line else rendered

    @classmethod
    def from_spec(cls, spec: dict[str, Any], file: Path, positions: Positioned, template_line: Any) -> Package:
        """Build the model from a spec already validated by the schema; fills defaults.

        Paths and names are checked again here, whole-string, so a schema pattern
        that is too loose can never let a path through to the runners.
        """
        _check_paths(spec, file, positions, template_line)
        if "license" in spec and (problem := license_problem(spec["license"])):
            line = positions.line(("license",))
            where = Location(str(file), int(template_line(line)) if template_line else line)
            raise InputError(f"license {spec['license']!r}: {problem}", where)
        deps = tuple(
            Dependency(d["stage"], d.get("from", "/"), d.get("to", "/"), bool(d.get("runtime", False)))
            for d in spec.get("dependencies", [])
        )
        steps = tuple(
            Step(
                sources=tuple(
                    Source(
                        destination=s["destination"],
                        url=s.get("url"),
                        sha256=s.get("sha256"),
                        debian=s.get("debian"),
                        path=s.get("path"),
                        exclude=tuple(s["exclude"]) if "exclude" in s else None,
                    )
                    for s in st.get("sources", [])
                ),
                env=tuple(sorted((str(k), _env_value(v)) for k, v in st.get("env", {}).items())),
                network=st.get("network", "none"),
                cache=tuple(st.get("cache", [])),
                scratch=tuple(st.get("scratch", [])),
                **{phase: tuple(st.get(phase, [])) for phase in SNIPPET_PHASES},
            )
            for st in spec.get("steps", [])
        )
        finalize = tuple(Finalize(f["from"], f["to"]) for f in spec.get("finalize", []))
        return cls(
            name=spec["name"],
            variant=spec.get("variant", "toolchain"),
            file=file,
            spec=spec,
            positions=positions,
            template_line=template_line,
            description=spec.get("description", ""),
            version=str(spec.get("version", "")),
            license=spec.get("license", ""),
            cpe=spec.get("cpe", ""),
            dependencies=deps,
            steps=steps,
            finalize=finalize,
        )

    def canonical(self) -> dict[str, Any]:
        """The spec with defaults filled in, so keys ignore how it was spelled."""
        return {
            "name": self.name,
            "variant": self.variant,
            "version": self.version,
            "dependencies": [
                {"stage": d.stage, "from": d.source, "to": d.to, "runtime": d.runtime} for d in self.dependencies
            ],
            "steps": [
                {
                    "sources": [{k: v for k, v in vars(s).items() if v is not None} for s in st.sources],
                    "env": dict(st.env),
                    "network": st.network,
                    # Only when declared: keys of steps without caches stay what they were.
                    **({"cache": list(st.cache)} if st.cache else {}),
                    **({"scratch": list(st.scratch)} if st.scratch else {}),
                    **{phase: list(getattr(st, phase)) for phase in SNIPPET_PHASES},
                }
                for st in self.steps
            ],
            "finalize": [{"from": f.source, "to": f.to} for f in self.finalize],
            "extension": self.spec.get("extension"),
        }


def _path_fields(spec: dict[str, Any]) -> list[tuple[Path_, Any, bool, bool]]:
    """(where, value, absolute, mount option) of every path a spec names."""
    fields: list[tuple[Path_, Any, bool, bool]] = []
    for i, dep in enumerate(spec.get("dependencies", [])):
        for key in ("from", "to"):
            if key in dep:
                fields.append((("dependencies", i, key), dep[key], True, True))
    for i, step in enumerate(spec.get("steps", [])):
        for j, source in enumerate(step.get("sources", [])):
            for key in ("destination", "path"):
                if key in source:
                    fields.append((("steps", i, "sources", j, key), source[key], False, False))
        for kind in ("cache", "scratch"):
            for j, directory in enumerate(step.get(kind, [])):
                fields.append((("steps", i, kind, j), directory, True, True))
    for i, fin in enumerate(spec.get("finalize", [])):
        for key in ("from", "to"):
            fields.append((("finalize", i, key), fin.get(key), True, False))
    return fields


def _check_paths(spec: dict[str, Any], file: Path, positions: Positioned, template_line: Any) -> None:
    """All path and name problems of a spec at once, located on template lines."""

    def where(path: Path_) -> Location:
        line = positions.line(path)
        return Location(str(file), int(template_line(line)) if template_line else line)

    errors: list[InputError] = []
    names: list[tuple[Path_, Any]] = [(("name",), spec.get("name"))]
    names += [(("dependencies", i, "stage"), d.get("stage")) for i, d in enumerate(spec.get("dependencies", []))]
    for path, value in names:
        problem = name_problem(value)
        if problem:
            errors.append(InputError(f"{path[-1]} {problem}, not {value!r}", where(path)))
    for path, value, absolute, mount in _path_fields(spec):
        problem = path_problem(value, absolute=absolute, mount=mount)
        label = path[-1] if isinstance(path[-1], str) else path[-2]  # cache and scratch entries are list items
        if problem is None and label in ("cache", "scratch") and os.path.normpath(value) == "/":
            problem = "must name a directory below /"
        if problem:
            errors.append(InputError(f"{label} {problem}, not {value!r}", where(path)))
    errors += _finalize_from_scratch(spec, where)
    for i, step in enumerate(spec.get("steps", [])):
        for key in step.get("env", {}):
            if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                errors.append(
                    InputError(f"env name {key!r} is not a valid shell variable name", where(("steps", i, "env")))
                )
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise InputErrors(list(errors))


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _finalize_from_scratch(spec: dict[str, Any], where: Callable[[Path_], Location]) -> list[InputError]:
    """A finalize that copies from a scratch directory, or from a directory holding one: refused, as a
    runner may hold it outside the root."""
    scratch = [
        os.path.normpath(path)
        for step in spec.get("steps", [])
        for path in step.get("scratch", [])
        if isinstance(path, str) and path.startswith("/")
    ]
    errors = []
    for i, fin in enumerate(spec.get("finalize", [])):
        source = fin.get("from")
        if not isinstance(source, str) or not source.startswith("/"):
            continue
        source = os.path.normpath(source)
        inside = [path for path in scratch if source == path or source.startswith(path + "/")]
        holds = [path for path in scratch if path.startswith(source.rstrip("/") + "/")]
        if inside:
            problem = "is in a scratch directory"
        elif holds:  # the sandbox would copy an empty mount point, docker the tree: runners would differ
            problem = f"holds the scratch directory {holds[0]!r}"
        else:
            continue
        errors.append(
            InputError(f"from {source!r} {problem}, never part of the output", where(("finalize", i, "from")))
        )
    return errors


MAX_LICENSE = 1000


@functools.cache
def _spdx_licensing() -> Any:
    """SPDX's license list, as license-expression knows it (loaded once, on first use)."""
    from license_expression import get_spdx_licensing

    return get_spdx_licensing()


def license_problem(expression: str) -> str | None:
    """What is wrong with an SPDX license expression (an unknown id, bad syntax), or None."""
    if len(expression) > MAX_LICENSE:
        return f"over {MAX_LICENSE} characters"
    try:
        info = _spdx_licensing().validate(expression, strict=True)
    except Exception:
        return "not a well-formed SPDX license expression (https://spdx.org/licenses/)"
    if info.errors:
        return "; ".join(info.errors) + " (an SPDX license expression: https://spdx.org/licenses/)"
    if info.normalized_expression != expression:
        return f"write it as SPDX does: {info.normalized_expression!r}"
    return None


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
