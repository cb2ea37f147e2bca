"""Validated package models, built from a rendered pkg.yaml that passed the schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.pkg.yamlpos import Path_, Positioned

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

    @property
    def is_local(self) -> bool:
        return self.path is not None


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
        """Build the model from a spec already validated by the schema; fills defaults."""
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
                    )
                    for s in st.get("sources", [])
                ),
                env=tuple(sorted((str(k), _env_value(v)) for k, v in st.get("env", {}).items())),
                network=st.get("network", "none"),
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
                    "sources": [
                        {k: v for k, v in vars(s).items() if v is not None} for s in st.sources
                    ],
                    "env": dict(st.env),
                    "network": st.network,
                    **{phase: list(getattr(st, phase)) for phase in SNIPPET_PHASES},
                }
                for st in self.steps
            ],
            "finalize": [{"from": f.source, "to": f.to} for f in self.finalize],
            "extension": self.spec.get("extension"),
        }


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
