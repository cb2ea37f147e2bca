"""System extensions: a package output turned into a squashfs layer over the rootfs.

An extension may only add files where extensions belong (/usr/local, kernel modules,
firmware, service definitions) and must declare which Kiln versions it works with, and may
declare the kernel releases (`kernel: ">=6.1,<6.2"`); every module it carries must sit under the
image kernel's release and carry that kernel's vermagic, or the kernel would refuse it at load.
Anything else is refused when the image is built, not discovered on a running machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from kiln import __version__
from kiln.core import nofollow, tools
from kiln.core.errors import BuildError, InputError, Location
from kiln.pkg.model import Package

ALLOWED = ("usr/local", "usr/lib/modules", "usr/lib/firmware")
MODULES = "usr/lib/modules"
MANIFEST_DIR = "usr/local/lib/kiln/extensions"


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    author: str
    description: str
    compatibility: str
    kernel: str | None = None  # a kernel version range, when the extension names one
    modules: tuple[str, ...] = ()  # what machined loads at boot

    def __post_init__(self) -> None:
        object.__setattr__(self, "modules", tuple(self.modules))

    def to_json(self) -> str:
        fields = {key: value for key, value in self.__dict__.items() if value not in (None, ())}
        return json.dumps(fields, indent=2, sort_keys=True) + "\n"


def manifest_for(package: Package) -> Manifest:
    """The manifest from the package's `extension:` section; refuses packages that are not extensions."""
    section: dict[str, Any] | None = package.spec.get("extension")
    if section is None:
        raise InputError(
            f"package '{package.name}' is not a system extension: add an `extension:` section "
            "with author and compatibility",
            Location(str(package.file), 1),
        )
    compatibility = str(section["compatibility"])
    kernel = str(section["kernel"]) if "kernel" in section else None
    for key, value, example in (("compatibility", compatibility, ">=0.1,<0.2"), ("kernel", kernel, ">=6.1,<6.2")):
        try:
            if value is not None:
                SpecifierSet(value)
        except InvalidSpecifier:
            raise InputError(
                f"extension '{package.name}': {key} {value!r} is not a version range like '{example}'",
                Location(str(package.file), package.line(("extension", key))),
            ) from None
    modules = tuple(str(name) for name in section.get("modules", ()))
    author = str(section["author"])
    return Manifest(package.name, package.version, author, package.description, compatibility, kernel, modules)


_NAME = re.compile(r"[a-z0-9][a-z0-9._+-]{0,63}")  # a package name: it names the layer's files
_MODULE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TEXT_LIMIT = 4096


def manifest_from_json(data: object, where: str) -> Manifest:
    """A manifest read from elsewhere (a pulled extension's description): every field checked, since the
    name becomes file names in the image and the ranges are parsed; refused with a word on the field."""

    def refuse(why: str) -> InputError:
        return InputError(f"extension {where}: its manifest {why}")

    if not isinstance(data, dict):
        raise refuse("is not a JSON object")
    unknown = set(data) - set(Manifest.__dataclass_fields__)
    if unknown:
        raise refuse(f"has unknown fields: {', '.join(sorted(map(str, unknown)))}")
    fields: dict[str, Any] = {}
    for key in ("name", "version", "author", "description", "compatibility", "kernel"):
        value = data.get(key)
        if value is None and key in ("kernel", "description"):
            continue
        if not isinstance(value, str) or len(value) > _TEXT_LIMIT or any(ord(c) < 0x20 for c in value):
            raise refuse(f"field {key!r} is not a line of text")
        fields[key] = value
    fields.setdefault("description", "")
    if not _NAME.fullmatch(fields["name"]):
        raise refuse(f"name {fields['name']!r} is not a package name")
    for key in ("compatibility", "kernel"):
        try:
            if key in fields:
                SpecifierSet(fields[key])
        except InvalidSpecifier:
            raise refuse(f"field {key!r} is not a version range: {fields[key]!r}") from None
    modules = data.get("modules", [])
    if (
        not isinstance(modules, list)
        or len(modules) > 256
        or not all(isinstance(m, str) and _MODULE.fullmatch(m) for m in modules)
    ):
        raise refuse("field 'modules' is not a list of module names")
    return Manifest(**fields, modules=tuple(modules))


def check_compatible(manifest: Manifest, kiln_version: str = __version__) -> None:
    if Version(kiln_version) not in SpecifierSet(manifest.compatibility):
        raise BuildError(
            f"extension '{manifest.name}' needs Kiln {manifest.compatibility}, this is Kiln {kiln_version}"
        )


def check_paths(name: str, tree: Path) -> None:
    """Every file must lie under an allowed prefix; directories leading to them are fine."""
    bad = []
    for entry in nofollow.walk(tree, what=f"extension '{name}'"):
        if not entry.is_dir and not any(entry.rel == p or entry.rel.startswith(p + "/") for p in ALLOWED):
            bad.append(entry.shown)
    if bad:
        shown = ", ".join(sorted(bad)[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise BuildError(f"extension '{name}' puts files outside {', '.join('/' + p for p in ALLOWED)}: {shown}")


def layer_tree(package_tree: Path, manifest: Manifest, dest: Path) -> Path:
    """The layer's content: the package output plus its manifest where machined looks for it.

    Copied as `cp -a` would (links stay links); the manifest is written through descriptors of the
    layer's own directories, so a link the extension planted on Kiln's manifest path is refused by name
    instead of writing a host file.
    """
    what = f"extension '{manifest.name}'"
    dest.mkdir(parents=True)
    nofollow.copy_tree(package_tree, "", dest, what=what)
    nofollow.write_in(dest, f"{MANIFEST_DIR}/{manifest.name}.json", manifest.to_json().encode(), what=what)
    return dest


def has_modules(tree: Path) -> bool:
    """Whether the tree carries kernel modules; a link on the way to or below /usr/lib/modules is refused."""
    if not nofollow.is_dir(tree, MODULES, what="kernel modules"):
        return False
    nofollow.refuse_links(tree, MODULES, what="kernel modules")
    return any(e.is_file and ".ko" in e.name for e in nofollow.walk(tree, MODULES, what="kernel modules"))


INDEX_KEPT = ("modules.order", "modules.builtin", "modules.builtin.modinfo")  # depmod's inputs, not its output


def modules_layer(rootfs: Path, layers: list[Path], dest: Path) -> Path | None:
    """A top layer with modules.dep and friends regenerated over the rootfs plus every extension.

    depmod runs on a merged copy of /usr/lib/modules that Kiln makes, into which no link is copied (a link
    on the way to or below any tree's /usr/lib/modules is refused by name), so the host's depmod reads and
    writes only that copy; only its index files go in the layer.
    """
    if not any(has_modules(layer) for layer in layers):
        return None
    merged = dest.parent / (dest.name + ".merged")
    merged.mkdir(parents=True)
    try:
        for tree in [rootfs, *layers]:
            if nofollow.is_dir(tree, MODULES, what="kernel modules"):
                nofollow.copy_tree(tree, MODULES, merged, MODULES, links=False, what="kernel modules")
        dest.mkdir(parents=True, exist_ok=True)
        for version, info in nofollow.children(merged, MODULES):
            if stat.S_ISDIR(info.st_mode):
                _depmod(merged, version, dest)
    finally:
        shutil.rmtree(merged)
    return dest


def _depmod(merged: Path, version: str, dest: Path) -> None:
    """depmod over one kernel version of the merged copy (`--`: a version is never an option); its index
    files copied into `dest`."""
    tools.run(["depmod", "-b", str(merged / "usr"), "--", version], what=f"depmod for {version}")
    where = f"{MODULES}/{version}"
    with (
        nofollow.opened_dir(merged, where, what="modules index") as source,
        nofollow.opened_dir(dest, where, create=True, what="modules index") as out,
    ):
        for name, info in nofollow.children(merged, where, what="modules index"):
            if name.startswith("modules.") and name not in INDEX_KEPT and stat.S_ISREG(info.st_mode):
                shown = f"/{where}/{name}"
                data = nofollow.read_at(source, name, shown, what="modules index")
                nofollow.write_at(out, name, data, shown, mode=0o644, times_ns=_times(info))


def _times(info: os.stat_result) -> tuple[int, int]:
    return info.st_atime_ns, info.st_mtime_ns


MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.gz", ".ko.zst")
MAX_MODULE = 256 << 20
_VERMAGIC = re.compile(rb"(?:^|\0)vermagic=([^\0]*)\0")


def kernel_release(kernel_tree: Path) -> str | None:
    """The release the kernel package's modules are installed for (/usr/lib/modules/<release>)."""
    if not nofollow.is_dir(kernel_tree, MODULES, what="kernel modules"):
        return None
    releases = [name for name, info in nofollow.children(kernel_tree, MODULES) if stat.S_ISDIR(info.st_mode)]
    return releases[0] if len(releases) == 1 else None


def module_files(tree: Path) -> list[Path]:
    """Every kernel module under tree's /usr/lib/modules, in a stable order; a link on the way to or below
    it is refused by name (the kernel would load what it points to, and Kiln signs and checks no link)."""
    if not nofollow.is_dir(tree, MODULES, what="kernel modules"):
        return []
    nofollow.refuse_links(tree, MODULES, what="kernel modules")
    found = [
        tree / entry.rel
        for entry in nofollow.walk(tree, MODULES, what="kernel modules")
        if entry.is_file and entry.name.endswith(MODULE_SUFFIXES)
    ]
    return sorted(found)


def vermagic(module: Path) -> str | None:
    """The module's vermagic, read from its bytes (a .modinfo entry is `vermagic=...` between NULs).

    Read in Python rather than by modinfo: the module is a hostile package's output and this check
    needs no ELF parser. None when it carries none, or two that differ. `module` comes from
    module_files, whose walk refused every link; it is opened without following one.
    """
    data = nofollow.read_walked(module, limit=MAX_MODULE, what="kernel module")
    found = {match.group(1) for match in _VERMAGIC.finditer(data)}
    return found.pop().decode(errors="replace") if len(found) == 1 else None


def _kernel_version(release: str) -> Version | None:
    match = re.match(r"\d+(\.\d+)*", release)
    return Version(match.group(0)) if match else None


def check_kernel(manifest: Manifest, tree: Path, kernel_tree: Path) -> None:
    """The extension fits the image's kernel: its kernel range holds the kernel's release, and each
    module lies under that release and carries the kernel's own vermagic."""
    name = manifest.name
    modules = module_files(tree)
    if manifest.kernel is None and not modules and not manifest.modules:
        return
    release = kernel_release(kernel_tree)
    if release is None:
        raise BuildError(
            f"extension '{name}' needs a kernel it can be checked against, but the image's kernel has no "
            "single /usr/lib/modules/<release> (a kernel given as a file cannot take extensions with modules)"
        )
    version = _kernel_version(release)
    if manifest.kernel is not None and (version is None or version not in SpecifierSet(manifest.kernel)):
        raise BuildError(f"extension '{name}' needs kernel {manifest.kernel}, this image's kernel is {release}")
    _check_named_modules(manifest, modules, kernel_tree, release)
    if not modules:
        return
    reference = next(iter(module_files(kernel_tree)), None)
    wanted = vermagic(reference) if reference else None
    if wanted is None:
        raise BuildError(f"extension '{name}' carries modules, but the image's kernel {release} has none to compare")
    for module in modules:
        rel = module.relative_to(tree / "usr/lib/modules")
        if not module.name.endswith(".ko"):
            raise BuildError(
                f"extension '{name}': /usr/lib/modules/{rel} is compressed; ship modules as plain .ko (they are "
                "signed and checked as they are, and the extension's squashfs compresses them)"
            )
        if rel.parts[0] != release:
            raise BuildError(
                f"extension '{name}': /usr/lib/modules/{rel} is installed for kernel {rel.parts[0]}, "
                f"this image's kernel is {release}"
            )
        got = vermagic(module)
        if got != wanted:
            raise BuildError(
                f"extension '{name}': /usr/lib/modules/{rel} was built for vermagic {got!r}, this image's kernel "
                f"has {wanted!r}; build it against this tree's kernel-build package"
            )


def _module_name(path: Path) -> str:
    return path.name.split(".ko")[0].replace("-", "_")


def _check_named_modules(manifest: Manifest, modules: list[Path], kernel_tree: Path, release: str) -> None:
    """Each module the extension asks machined to load is one it or the kernel carries (or builds in)."""
    known = {_module_name(p) for p in [*modules, *module_files(kernel_tree)]}
    builtin = f"{MODULES}/{release}/modules.builtin"
    info = nofollow.lstat_in(kernel_tree, builtin, what="kernel modules")
    if info is not None and stat.S_ISREG(info.st_mode):
        text = nofollow.read_in(kernel_tree, builtin, limit=MAX_MODULE, what="kernel modules").decode(errors="replace")
        known |= {_module_name(Path(line)) for line in text.split()}
    for name in manifest.modules:
        if name.replace("-", "_") not in known:
            raise BuildError(
                f"extension '{manifest.name}' names module '{name}' to load at boot, but neither it nor the "
                f"kernel {release} carries that module"
            )
