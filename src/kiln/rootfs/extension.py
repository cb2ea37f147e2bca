"""System extensions: a package output turned into a squashfs layer over the rootfs.

An extension may only add files where extensions belong (/usr/local, kernel modules,
firmware, service definitions) and must declare which Kiln versions it works with;
anything else is refused when the image is built, not discovered on a running machine.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from kiln import __version__
from kiln.core import tools
from kiln.core.errors import BuildError, InputError, Location
from kiln.pkg.model import Package

ALLOWED = ("usr/local", "usr/lib/modules", "usr/lib/firmware")
MANIFEST_DIR = "usr/local/lib/kiln/extensions"


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    author: str
    description: str
    compatibility: str

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True) + "\n"


def manifest_for(package: Package) -> Manifest:
    """The manifest from the package's `extension:` section; refuses packages that are not extensions."""
    where = Location(str(package.file), package.line(("extension",)))
    section: dict[str, Any] | None = package.spec.get("extension")
    if section is None:
        raise InputError(
            f"package '{package.name}' is not a system extension: add an `extension:` section "
            "with author and compatibility",
            Location(str(package.file), 1),
        )
    compatibility = str(section["compatibility"])
    try:
        SpecifierSet(compatibility)
    except InvalidSpecifier:
        raise InputError(
            f"extension '{package.name}': compatibility {compatibility!r} is not a version range like '>=0.1,<0.2'",
            where,
        ) from None
    return Manifest(package.name, package.version, str(section["author"]), package.description, compatibility)


def check_compatible(manifest: Manifest, kiln_version: str = __version__) -> None:
    if Version(kiln_version) not in SpecifierSet(manifest.compatibility):
        raise BuildError(
            f"extension '{manifest.name}' needs Kiln {manifest.compatibility}, this is Kiln {kiln_version}"
        )


def check_paths(name: str, tree: Path) -> None:
    """Every file must lie under an allowed prefix; directories leading to them are fine."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(tree):
        base = Path(dirpath)
        for entry in [*filenames, *(d for d in dirnames if (base / d).is_symlink())]:
            rel = (base / entry).relative_to(tree).as_posix()
            if not any(rel == p or rel.startswith(p + "/") for p in ALLOWED):
                bad.append("/" + rel)
    if bad:
        shown = ", ".join(sorted(bad)[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise BuildError(f"extension '{name}' puts files outside {', '.join('/' + p for p in ALLOWED)}: {shown}")


def layer_tree(package_tree: Path, manifest: Manifest, dest: Path) -> Path:
    """The layer's content: the package output plus its manifest where machined looks for it."""
    shutil.copytree(package_tree, dest, symlinks=True)
    manifests = dest / MANIFEST_DIR
    manifests.mkdir(parents=True, exist_ok=True)
    (manifests / f"{manifest.name}.json").write_text(manifest.to_json())
    return dest


def has_modules(tree: Path) -> bool:
    modules = tree / "usr/lib/modules"
    return modules.is_dir() and any(p.suffix in (".ko", ".xz", ".zst") for p in modules.rglob("*.ko*"))


def modules_layer(rootfs: Path, layers: list[Path], dest: Path) -> Path | None:
    """A top layer with modules.dep and friends regenerated over the rootfs plus every extension.

    depmod runs on a merged copy of /usr/lib/modules; only its index files go in the layer.
    """
    if not any(has_modules(layer) for layer in layers):
        return None
    merged = dest.parent / (dest.name + ".merged")
    shutil.copytree(rootfs / "usr/lib/modules", merged / "usr/lib/modules", symlinks=True)
    for layer in layers:
        if (layer / "usr/lib/modules").is_dir():
            shutil.copytree(layer / "usr/lib/modules", merged / "usr/lib/modules", symlinks=True, dirs_exist_ok=True)
    for version_dir in sorted((merged / "usr/lib/modules").iterdir()):
        tools.run(["depmod", "-b", str(merged), version_dir.name], what=f"depmod for {version_dir.name}")
        out = dest / "usr/lib/modules" / version_dir.name
        out.mkdir(parents=True, exist_ok=True)
        for index in sorted(version_dir.glob("modules.*")):
            if index.name not in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
                shutil.copy2(index, out / index.name)
    shutil.rmtree(merged)
    return dest
