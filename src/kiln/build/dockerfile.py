"""The Dockerfile export: a package graph as one multi-stage Dockerfile, so any BuildKit can build it.

A pure conversion in bldr's steps (header and seed, prebuilt outputs, sources, base, dependencies,
steps, finalize), used by `kiln export dockerfile` and by the buildkit runner.

Each package becomes up to three stages:

- `src-<name>` (only with sources): FROM the seed, the package's placed /tmp/build copied from
  the context and checked in a RUN against a SHA256SUMS file whose own sha256 is written in the
  Dockerfile, so a build context altered after export fails;
- `build-<name>`: FROM the variant's base (the seed, `kiln-base-toolchain`, or scratch), then the
  dependency outputs COPYed to their `to` (shallow first, bottom first, as the overlay stacks
  them), /tmp/build, and one RUN per snippet with the sandbox's environment;
- `out-<name>`: FROM scratch, the finalize paths COPYed out of `build-<name>`.

`kiln-outputs` gathers the wanted `out-` stages under /<label>/ for `--output type=local`.
The seed is a base image (`ARG KILN_STAGE0`, by default `kiln/stage0:<key>` as the docker
runner imports it) or, with `stage0="tar"`, `ADD stage0.tar` into a stage of its own, which
needs no image store and suits remote builders at the price of a large context.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kiln.build.rootplan import STEP_WRAPPER, base_env, cache_name, overlay_order
from kiln.core import tools
from kiln.core.errors import BuildError, InputError
from kiln.core.hashing import file_sha256
from kiln.core.paths import spec_parts
from kiln.pkg.graph import Graph
from kiln.pkg.model import Package

SKEL = "skel"
TOOLCHAIN_BASE = "kiln-base-toolchain"
SEED_STAGE = "kiln-stage0"
OUTPUTS = "kiln-outputs"


def stage_id(name: str) -> str:
    """Package names may hold '+', which stage names may not; '_' never occurs in a package name."""
    return name.replace("+", "_")


@dataclass
class Export:
    """What `write_context` produced: the Dockerfile's path and which packages need the network."""

    context: Path
    dockerfile: Path
    networked: list[str] = field(default_factory=list)
    stages: dict[str, str] = field(default_factory=dict)  # stage name -> package name


def _fresh_context(context: Path) -> None:
    """An empty context holding the build-root skeleton every package starts from."""
    if context.exists():
        shutil.rmtree(context)
    context.mkdir(parents=True)
    skel = context / SKEL / "tmp" / "build"
    skel.mkdir(parents=True)
    (context / SKEL / "tmp").chmod(0o1777)
    skel.chmod(0o755)


@dataclass
class Exporter:
    """Writes the build context for `names` (a closure in build order) of `graph`."""

    graph: Graph
    keys: dict[str, str]
    seed_key: str
    place_sources: Callable[[Package, Path], None]
    source_date_epoch: int
    jobs: int
    network_flags: bool = True
    stage0: str = "image"  # or "tar"
    seed_tree: Path | None = None
    prebuilt: dict[str, Path] = field(default_factory=dict)  # name -> stored tree, used instead of building

    def write(self, names: list[str], exported: dict[str, str], context: Path) -> Export:
        """Fill `context` (emptied first); `exported` maps package name -> directory in kiln-outputs."""
        _fresh_context(context)
        result = Export(context, context / "Dockerfile")
        seed_ref, lines = self._header(context)
        toolchain_base_done = False
        for name in names:
            lines.append("")
            if name in self.prebuilt:
                lines += self._prebuilt_stage(name, context, result)
                continue
            package = self.graph.tree.packages[name]
            if package.variant == "toolchain" and not toolchain_base_done:
                lines += [
                    f"FROM {seed_ref} AS {TOOLCHAIN_BASE}",
                    f"COPY --from=out-{stage_id(self.graph.tree.toolchain)} / /",
                    "",
                ]
                toolchain_base_done = True
            lines += self._package_stages(package, context, seed_ref, result)
        lines += ["", "# Every wanted output under /<name>/ (/<key>/ when kiln builds).", f"FROM scratch AS {OUTPUTS}"]
        lines += [f"COPY --from=out-{stage_id(name)} / /{label}/" for name, label in exported.items()]
        result.networked = sorted(set(result.networked))
        result.dockerfile.write_text("\n".join(lines) + "\n")
        (context / ".dockerignore").write_text("Dockerfile\n")
        return result

    def _header(self, context: Path) -> tuple[str, list[str]]:
        """The Dockerfile's opening lines, and how later stages name the seed (an image, or a stage from a tar)."""
        lines = [
            "# Written by `kiln export dockerfile`: one stage per package, in build order.",
            f"# Build: DOCKER_BUILDKIT=1 docker build --target {OUTPUTS} --output type=local,dest=OUT .",
            f"ARG KILN_STAGE0=kiln/stage0:{self.seed_key}",
        ]
        if self.stage0 == "image":
            return "${KILN_STAGE0}", lines
        if self.stage0 != "tar":
            raise InputError(f"unknown stage0 mode {self.stage0!r}: choose image or tar")
        if self.seed_tree is None:
            raise BuildError("the stage0 tarball needs the seed in the store: run kiln bootstrap")
        _tar_tree(self.seed_tree, context / "stage0.tar")
        return SEED_STAGE, [*lines, "", f"FROM scratch AS {SEED_STAGE}", "ADD stage0.tar /"]

    def _prebuilt_stage(self, name: str, context: Path, result: Export) -> list[str]:
        """A package kiln already stored: its tree copied in as the output stage, nothing built."""
        key = self.keys[name]
        _link_tree(self.prebuilt[name], context / "prebuilt" / key)
        result.stages[f"out-{stage_id(name)}"] = name
        return [
            f"# {name}: stored by kiln as {key}",
            f"FROM scratch AS out-{stage_id(name)}",
            f"COPY prebuilt/{key}/ /",
        ]

    def _package_stages(self, package: Package, context: Path, seed_ref: str, result: Export) -> list[str]:
        """One package as bldr converts one: sources, base, dependencies, steps, then finalize."""
        name, sid = package.name, stage_id(package.name)
        lines = [f"# {name} {package.version}".rstrip() + f" (key {self.keys[name]})"]
        has_sources = any(step.sources for step in package.steps)
        if has_sources:
            lines += self._sources_stage(package, context, seed_ref)
            result.stages[f"src-{sid}"] = name
        base = {"stage0": seed_ref, "toolchain": TOOLCHAIN_BASE}.get(package.variant, "scratch")
        lines += [f"FROM {base} AS build-{sid}", f"COPY {SKEL}/ /"]
        result.stages[f"build-{sid}"] = name
        lines += self._dependency_copies(package)
        if has_sources:
            lines.append(f"COPY --from=src-{sid} /kiln-src/tree/ /tmp/build/")
        lines += self._steps(package, result)
        lines.append(f"FROM scratch AS out-{sid}")
        result.stages[f"out-{sid}"] = name
        lines += [f"COPY --from=build-{sid} {_q(final.source)} {_q(final.to)}" for final in package.finalize]
        return lines

    def _steps(self, package: Package, result: Export) -> list[str]:
        """The step environment once, then one RUN per snippet, with the step's env and network."""
        if not package.steps:
            return []
        env = base_env(self.source_date_epoch, self.jobs)
        lines = ["ENV " + " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(env.items()))]
        for step in package.steps:
            exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in sorted(step.env))
            if step.scratch:  # a plain directory here, there from the step's first snippet on as in the sandbox
                exports += "mkdir -p " + " ".join(shlex.quote(path) for path in step.scratch) + "; "
            if step.network == "default":
                result.networked.append(package.name)
            flag = ""
            if self.network_flags:
                flag = "--network=default " if step.network == "default" else "--network=none "
            arch = self.graph.tree.platform.arch
            for path in step.cache:  # BuildKit's own cache mounts, one id per package, arch and path
                flag += f"--mount=type=cache,id=kiln-{package.name}-{arch}-{cache_name(path)},target={path} "
            for _, script in step.snippets():
                argv = ["/bin/sh", "-c", f"{exports}{STEP_WRAPPER}", "kiln-env", script]
                lines.append(f"RUN {flag}{json.dumps(argv)}")
        return lines

    def _sources_stage(self, package: Package, context: Path, seed_ref: str) -> list[str]:
        """Sources placed as the sandbox places them, then verified by sha256 inside the build."""
        sid = stage_id(package.name)
        where = context / "sources" / sid
        tree = where / "tree"
        tree.mkdir(parents=True)
        tree.chmod(0o755)
        self.place_sources(package, tree)
        sums = []
        for path in sorted(p for p in tree.rglob("*") if p.is_file() and not p.is_symlink()):
            rel = path.relative_to(tree).as_posix()
            if "\n" in rel or "\\" in rel:
                raise InputError(f"package '{package.name}': source file name {rel!r} cannot be checked by sha256sum")
            sums.append(f"{file_sha256(path)}  ./{rel}\n")
        (where / "SHA256SUMS").write_text("".join(sums))
        pins = [s.sha256 for step in package.steps for s in step.sources if s.sha256]
        check = (
            f"cd /kiln-src/tree && echo '{file_sha256(where / 'SHA256SUMS')}  ../SHA256SUMS' | sha256sum -c --quiet - "
            "&& sha256sum -c --quiet ../SHA256SUMS"
        )
        flag = "--network=none " if self.network_flags else ""
        return [
            *(f"# source sha256 {pin}" for pin in pins),
            f"FROM {seed_ref} AS src-{sid}",
            f"COPY sources/{sid}/ /kiln-src/",
            f"RUN {flag}{json.dumps(['/bin/sh', '-euc', check])}",
            "",
        ]

    def _dependency_copies(self, package: Package) -> list[str]:
        """Dependency outputs at their `to`: shallow paths first, bottom layer first, like the overlay."""
        copies = []
        for dep in self.graph.build_inputs(package.name):
            at = os.path.normpath(dep.to)
            source = dep.source.rstrip("/") + "/"
            copies.append((at, f"COPY --from=out-{stage_id(dep.stage)} {_q(source)} {_q(at.rstrip('/') + '/')}"))
        return [line for _, group in overlay_order(copies) for line in reversed(group)]


def _q(path: str) -> str:
    """A path as a JSON-free COPY argument; spaces would need the JSON form, which COPY --from also takes.

    Control characters and `..` are refused as on every runner (kiln.core.paths.spec_parts).
    """
    spec_parts(path)
    if any(c.isspace() for c in path):
        raise InputError(f"path {path!r} has white space, which the Dockerfile export does not support")
    return path


def _link_tree(tree: Path, dest: Path) -> None:
    """Hard-link a stored tree into the context: no copy, and BuildKit only reads it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tools.run(["cp", "-al", str(tree), str(dest)], what=f"linking {tree} into the build context")


def _tar_tree(tree: Path, dest: Path) -> None:
    # Exit 1 is "file changed as we read it": hard-linking a stored tree elsewhere changes inode ctimes.
    tools.run(
        ["tar", "-C", str(tree), "--numeric-owner", "--sort=name", "--warning=no-file-changed", "-cf", str(dest), "."],
        what="archiving the seed",
        ok=(0, 1),
    )
