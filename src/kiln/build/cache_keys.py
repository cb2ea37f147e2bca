"""Cache keys: one sha256 per package that changes exactly when its build could.

A key covers the canonical rendered spec, the bytes (and exec bits) of the files in
the package directory, local source trees, remote sources' sha256s, the keys
of its dependencies, the key of its base (variant) and the platform. It never
reads the clock, the environment, the working directory or absolute paths.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from kiln.core.errors import InputError, Location
from kiln.core.hashing import file_sha256, json_sha256
from kiln.pkg.graph import Graph
from kiln.pkg.loader import PKG_FILE, VARS_FILE, Tree
from kiln.pkg.model import Package, Source, excluded

KEY_SCHEMA = "kiln-key-v1"


def tree_digest(directory: Path, *, skip_package_dirs: bool = False, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """Relative path -> content hash for every file below `directory`.

    Symlinks hash their target text; executables are marked, since a script's
    mode changes what a build does. Nested package directories belong to their
    own package and are skipped when asked; so are paths matching `exclude`
    (a local source's patterns, which its copy leaves out as well).
    """
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        base = Path(dirpath)
        kept = []
        for d in sorted(dirnames):
            sub = base / d
            if d.startswith(".") or (skip_package_dirs and (sub / PKG_FILE).is_file()):
                continue
            if excluded(sub.relative_to(directory).as_posix(), exclude):
                continue
            if sub.is_symlink():
                out[sub.relative_to(directory).as_posix()] = "link:" + os.readlink(sub)
                continue
            kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            path = base / name
            rel = path.relative_to(directory).as_posix()
            if excluded(rel, exclude):
                continue
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                out[rel] = "link:" + os.readlink(path)
            else:
                exec_bit = "x" if info.st_mode & 0o111 else "-"
                out[rel] = f"{exec_bit}{file_sha256(path)}"
    return out


def package_files_digest(package: Package) -> dict[str, str]:
    """The package directory's files, minus pkg.yaml and vars.yaml.

    Those two reach the key through the rendered, canonical spec instead, so a
    comment or reordered keys do not cause a rebuild, while any change to what
    they render to does.
    """
    files = tree_digest(package.directory, skip_package_dirs=True)
    files.pop(PKG_FILE, None)
    files.pop(VARS_FILE, None)
    return files


def platform_identity(tree: Tree) -> dict[str, str]:
    """The platforms a key names: the target, and the build machine when it differs.

    A native build's build platform is its target, so its keys stay what they were before
    cross builds existed; an amd64-built arm64 package names both.
    """
    identity = {"platform": str(tree.platform)}
    if tree.cross:
        identity["build_platform"] = str(tree.builder_platform)
    return identity


def stage0_key(tree: Tree) -> str:
    """The seed's key: its definition (defaults filled in, cross compilers when cross), or a user tarball's hash."""
    return json_sha256(
        {"schema": KEY_SCHEMA, "stage0": tree.stage0.identity(tree.platform.arch if tree.cross else None)}
        | platform_identity(tree)
    )


def local_source_digest(tree: Tree, package: Package, source: Source, where: tuple[str | int, ...]) -> dict[str, str]:
    project_root = tree.project_root_of(package)
    path = str(source.path)
    root = project_root / path
    if not root.exists():
        raise InputError(
            f"local source path {path!r} does not exist under {project_root}",
            Location(str(package.file), package.line(where)),
        )
    if root.is_file():
        if source.exclude is not None:
            raise InputError(
                f"local source path {path!r} is a file: exclude is for directories",
                Location(str(package.file), package.line(where)),
            )
        return {root.name: file_sha256(root)}
    return tree_digest(root, exclude=source.exclude or ())


def compute_keys(graph: Graph) -> dict[str, str]:
    """Keys for every package of the graph, in one pass along the build order."""
    tree = graph.tree
    keys: dict[str, str] = {}
    seed = stage0_key(tree)
    native = compute_keys(Graph(tree.native)) if tree.native is not None else {}
    for name in graph.order:
        package = tree.packages[name]
        if tree.native_tool(name):  # built natively, once for every target
            keys[name] = native[name]
            continue
        if package.variant == "stage0":
            base = seed
        elif package.variant == "toolchain":
            base = json_sha256([seed, keys[tree.toolchain]])
        else:
            base = json_sha256("scratch")
        sources: list[Any] = []
        for s_index, step in enumerate(package.steps):
            for index, source in enumerate(step.sources):
                if source.path is not None:
                    where = ("steps", s_index, "sources", index, "path")
                    sources.append({"local": local_source_digest(tree, package, source, where)})
                else:
                    sources.append(source.sha256)
        keys[name] = json_sha256(
            {
                "schema": KEY_SCHEMA,
                "spec": package.canonical(),
                "files": package_files_digest(package),
                "sources": sources,
                "deps": {dep: keys[dep] for dep in graph.edges[name]},
                "base": base,
            }
            | platform_identity(tree)
        )
    return keys
