"""`kiln image PROFILE...`: build what the profiles need, then write each profile's outputs.

Order of work: load and check every profile (all errors at once), build the union of their
packages through the graph, assemble kernel + initramfs once per distinct set of inputs, then
write the outputs of all profiles concurrently (they are independent and mostly wait on
tools), each into DIR/<name>/ with manifest.json, SBOMs (SPDX and CycloneDX) and its SLSA provenance
(kiln.image.provenance). A profile's directory is written under a temporary name and renamed into
place, so a failed run leaves the previous output intact.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.core import nofollow
from kiln.core.errors import BuildError, InputError, KilnError
from kiln.core.hashing import file_sha256
from kiln.image.arch import check_kernel_arch, check_kernel_files, loader_for
from kiln.image.assets import BootAssets
from kiln.image.manifest import SbomPackage, SbomSubject, load_spdx, write_manifest, write_spdx
from kiln.image.oci_extension import Pulled, Reference, extension_layers, is_oci, pull_all
from kiln.image.order import expected_cost
from kiln.image.outputs.kinds import KINDS, Writer
from kiln.image.profile import CONFIG_PATH, Profile
from kiln.image.provenance import Origin, Part, origin, write_provenance
from kiln.image.sbom_cyclonedx import write_cyclonedx
from kiln.image.signing_keys import boot_chain_keys, module_signer, resolve_keys
from kiln.pkg.graph import Graph
from kiln.rootfs.extension import manifest_for
from kiln.signing.modules import ModuleSigner
from kiln.signing.release import sign_release

Say = Callable[[str], None]


@dataclass
class Built:
    """What the graph gave: store trees and keys by package name."""

    graph: Graph
    trees: dict[str, Path]
    keys: dict[str, str]
    epoch: int
    pulled: dict[str, Pulled] = field(default_factory=dict)  # extensions from registries, by reference
    started: float = 0.0  # time.time() when the run began: the provenance's startedOn
    runner: str = "sandbox"  # what ran the packages' steps: the provenance's builder


@dataclass
class Result:
    profile: Profile
    directory: Path
    artifacts: list[dict[str, Any]]
    seconds: float


def build_packages(
    profiles: list[Profile],
    graph: Graph,
    jobs: int,
    *,
    json_output: bool,
    extra: tuple[str, ...] = (),
    cache_from: str | None = None,
    runner: str = "sandbox",
) -> Built:
    """Build (or find in the store) every package the profiles need, plus `extra` ones, on `runner`; with
    `cache_from`, what a registry cache has is pulled first (kiln build --cache-from)."""
    from kiln.build.session import Session, choose_progress

    started = time.time()
    targets: list[str] = list(extra)
    for profile in profiles:
        targets += [*profile.packages_to_build(), *KINDS[profile.kind].packages]
    targets = list(dict.fromkeys(targets))
    # before the build: a reference that does not resolve, verify or fit this arch fails at once
    pulled = pull_all([e for p in profiles for e in p.oci_extensions], graph.tree.platform.arch)
    session = Session.open(graph, runner)
    if targets:
        progress = choose_progress(json_output=json_output)
        session.build_all(targets, jobs, progress, purpose="cannot make the images", cache_from=cache_from)
    trees = session.trees(targets)
    runner = session.builder.runner.name
    return Built(graph, trees, session.keys, session.source_date_epoch, pulled, started, runner)


class AssetMaker:
    """Kernel + initramfs per distinct input set, made once and shared by the profiles that need it."""

    def __init__(self, built: Built, work: Path, say: Say) -> None:
        self.built = built
        self.work = work
        self.say = say
        self._lock = threading.Lock()
        self._made: dict[str, tuple[Path, Path, tuple[str, str]]] = {}

    def identity(self, profile: Profile, signer: ModuleSigner | None) -> str:
        data = {
            "kernel": self.built.keys[profile.kernel.package]
            if profile.kernel.package
            else file_sha256(profile.kernel.path)
            if profile.kernel.path
            else None,
            "initramfs": file_sha256(profile.initramfs) if profile.initramfs else None,
            "init": profile.init,
            "rootfs": profile.rootfs,
            "packages": profile.packages,
            "extensions": [self.built.pulled[e].reference if is_oci(e) else e for e in profile.extensions],
            "config": profile.machine_config,
            "keys": {n: self.built.keys[n] for n in profile.asset_packages()},
            "module_key": signer.fingerprint if signer else None,
            "schematic": profile.schematic.id if profile.schematic else None,
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def assets(self, profile: Profile) -> BootAssets:
        vmlinuz, initramfs, digests = self._files(profile)
        check_kernel_arch(profile, vmlinuz)
        return BootAssets.make(
            vmlinuz,
            initramfs,
            profile.cmdline(),
            profile.version,
            self.built.epoch,
            digests,
            loader_for(profile, self.built.trees),
            boot_chain_keys(profile),
        )

    def _files(self, profile: Profile) -> tuple[Path, Path, tuple[str, str]]:
        """vmlinuz, initramfs and their sha256s: made and hashed once per input set."""
        signer = module_signer(profile)  # read once: it is in the identity and signs the modules
        identity = self.identity(profile, signer)
        with self._lock:
            if identity not in self._made:
                vmlinuz, initramfs = self._make(profile, self.work / identity[:16], signer)
                self._made[identity] = (vmlinuz, initramfs, (file_sha256(vmlinuz), file_sha256(initramfs)))
            return self._made[identity]

    def _make(self, profile: Profile, where: Path, signer: ModuleSigner | None) -> tuple[Path, Path]:
        from kiln.rootfs.assemble import INIT, KERNEL, Inputs, assemble, copy_vmlinuz

        where.mkdir(parents=True)
        kernel_tree = self._kernel_tree(profile, where)
        if profile.initramfs is not None:  # vmlinuz copied out of the package without following a link
            return copy_vmlinuz(kernel_tree, where / "vmlinuz"), profile.initramfs
        trees = {
            **{n: self.built.trees[n] for n in profile.asset_packages()},
            KERNEL: kernel_tree,
            INIT: self.built.trees[profile.init],
        }
        rootfs = [*profile.rootfs, *profile.packages]
        if profile.machine_config is not None:
            config = where / "config-tree"
            target = config / CONFIG_PATH.lstrip("/")
            target.parent.mkdir(parents=True)
            target.write_text(json.dumps(profile.machine_config, indent=2, sort_keys=True) + "\n")
            trees["profile machine_config"] = config
            rootfs.append("profile machine_config")
        if profile.schematic is not None:
            from kiln.image.schematic import ROOTFS_PATH

            marked = where / "schematic-tree" / ROOTFS_PATH
            marked.parent.mkdir(parents=True)
            marked.write_text(profile.schematic.rootfs_document())
            trees["profile schematic"] = where / "schematic-tree"
            rootfs.append("profile schematic")
        packages = self.built.graph.tree.packages
        manifests = extension_layers(
            profile.extensions, self.built.pulled, trees, lambda name: manifest_for(packages[name])
        )
        self.say(f"{profile.name}: assembling kernel + initramfs")
        assemble(Inputs(trees, rootfs, manifests, signer), where, self.built.epoch, self.say)
        return where / "vmlinuz", where / "initramfs.zst"

    def _kernel_tree(self, profile: Profile, where: Path) -> Path:
        if profile.kernel.package:
            return self.built.trees[profile.kernel.package]
        assert profile.kernel.path is not None
        tree = where / "kernel-file"
        (tree / "boot").mkdir(parents=True)
        shutil.copyfile(profile.kernel.path, tree / "boot/vmlinuz")
        return tree


def write_output(profile: Profile, assets: BootAssets, dest: Path, built: Built) -> None:
    """The profile's output kind, in dest (an empty directory), by the kind's writer (outputs.kinds)."""
    kind = KINDS.get(profile.kind)
    if kind is None:  # the schema allows nothing else
        raise InputError(f"unknown output kind {profile.kind}", profile.location("output", "kind"))
    writer: Writer = importlib.import_module(kind.module).write
    writer(profile, assets, dest, built.trees)


MACHINED_PATH = "usr/sbin/machined"


def package_file(tree: Path, rel: str, dest: Path, mode: int, what: str) -> Path:
    """A file of a package's output copied to `dest` (Kiln's) for host tools to read: a link there or on the
    way is refused by name (kiln.core.nofollow), so no host file is read in its place."""
    try:
        nofollow.copy_file_in(tree, rel, dest, mode=mode, what=what)
    except FileNotFoundError:
        raise InputError(f"{what}: /{rel} does not exist in its output ({tree})") from None
    return dest


def manifest_inputs(profile: Profile, assets: BootAssets, built: Built) -> dict[str, Any]:
    return {
        "packages": {name: built.keys[name] for name in profile.packages_to_build()},
        "vmlinuz_sha256": assets.vmlinuz_sha256,
        "initramfs_sha256": assets.initramfs_sha256,
        "cmdline": assets.cmdline,
        "profile_sha256": file_sha256(profile.file),
        **pulled_inputs(profile, built),
        "source_date_epoch": assets.epoch,
    }


def pulled_inputs(profile: Profile, built: Built) -> dict[str, Any]:
    """The registry extensions by the reference given and the digest-pinned one they resolved to."""
    pulled = {name: built.pulled[name].reference for name in profile.oci_extensions}
    return {"extensions": pulled} if pulled else {}


def sbom_packages(profile: Profile, built: Built) -> list[SbomPackage]:
    packages = built.graph.tree.packages
    roles: list[tuple[str, str]] = []
    if profile.kernel.package:
        roles.append((profile.kernel.package, "kernel"))
    if profile.initramfs is None:
        roles += [
            (profile.init, "init"),
            *[(n, "rootfs") for n in (*profile.rootfs, *profile.packages)],
            *[(n, "extension") for n in profile.package_extensions],
        ]
    if profile.loader_package:
        roles.append((profile.loader_package, "bootloader"))
    from_tree = [SbomPackage.built(packages[name], built.keys[name], role) for name, role in dict(roles).items()]
    pulled = profile.oci_extensions if profile.initramfs is None else ()  # a given initramfs takes no layers
    return from_tree + [registry_sbom_package(built.pulled[name]) for name in pulled]


def registry_sbom_package(pulled: Pulled) -> SbomPackage:
    """A registry extension in the SBOMs: its description's name and version, its pinned reference and purl."""
    reference, manifest = Reference.parse(pulled.reference), pulled.manifest
    return SbomPackage(
        manifest.name,
        manifest.version,
        "extension",
        manifest.description,
        reference=pulled.reference,
        digest=reference.digest or "",
        purl=reference.purl,
    )


def replace_dir(new: Path, final: Path, aside: Path, tries: int = 100) -> None:
    """Rename `new` to `final`, moving an existing `final` to `aside` (a path of ours) first.

    Other `kiln image` runs may write the same out/<profile> at the same time: every move is a
    rename, so a reader sees one complete output or another, and the last run's stays.
    """
    for _ in range(tries):
        try:
            new.rename(final)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        try:
            final.rename(aside)
        except FileNotFoundError:
            continue  # another run moved it first
        shutil.rmtree(aside)
    raise BuildError(f"could not replace {final}: other runs keep writing it")


def make_profile(profile: Profile, maker: AssetMaker, out: Path, say: Say, run: Origin | None) -> Result:
    """All of one profile's output, renamed into out/<name>/ once complete; its provenance with `run`
    (None: the caller writes one later, as a multi-platform merge does)."""
    began = time.monotonic()
    assets = maker.assets(profile)
    final = out / profile.name
    with tempfile.TemporaryDirectory(prefix=f".{profile.name}-", dir=out) as tmp:
        dest = Path(tmp) / profile.name
        dest.mkdir()
        say(f"{profile.name}: writing {profile.kind} output")
        write_output(profile, assets, dest, maker.built)
        contents = sbom_packages(profile, maker.built)
        schematic = profile.schematic.id if profile.schematic else None
        subject = SbomSubject(profile.name, profile.version, assets.seed, assets.epoch, contents, schematic)
        write_spdx(dest, subject)
        write_cyclonedx(dest, subject)
        identity = {
            "name": profile.name,
            "arch": profile.arch,
            "platform": profile.platform,
            "version": profile.version,
            "kind": profile.kind,
            **({"schematic": schematic} if schematic else {}),
        }
        manifest = write_manifest(dest, identity, manifest_inputs(profile, assets, maker.built))
        if run is not None:
            write_provenance(dest, [Part(profile, maker.built)], run)
        keys = resolve_keys(profile, None)
        if keys is not None:
            say(f"{profile.name}: signing SHA256SUMS with the release key")
            sign_release(dest, keys)
        replace_dir(dest, final, Path(tmp) / "replaced")
    artifacts = json.loads((final / manifest.name).read_text())["artifacts"]
    seconds = time.monotonic() - began
    say(f"{profile.name}: done in {seconds:.1f} s")
    return Result(profile, final, artifacts, seconds)


# The modules AssetMaker imports, and (outputs.kinds) each kind's writer: imported in the main thread
# before the pool starts, as concurrent first imports from worker threads can race.
_ASSET_MODULES = ("kiln.rootfs.extension", "kiln.rootfs.assemble")


def load_worker_modules(profiles: list[Profile]) -> None:
    """Import, in this thread, everything the image workers will import for these profiles."""
    for name in (*_ASSET_MODULES, *(KINDS[p.kind].module for p in profiles)):
        importlib.import_module(name)
    load_spdx()


def make_images(
    profiles: list[Profile], built: Built, out: Path, jobs: int, say: Say, *, provenance: bool = True
) -> list[Result]:
    """Write every profile's outputs under out/, `jobs` profiles at a time; each with its provenance
    unless `provenance` is False (the caller merges the directories and writes one for the merge)."""
    check_kernel_files(profiles)
    out.mkdir(parents=True, exist_ok=True)
    load_worker_modules(profiles)
    run = origin(built) if provenance else None  # git and the trees' digests, once for every profile
    with tempfile.TemporaryDirectory(prefix=".kiln-assets-", dir=out) as work:
        maker = AssetMaker(built, Path(work), say)
        with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
            # the longest first, so no long one starts last while the other workers idle
            order = sorted(range(len(profiles)), key=lambda i: expected_cost(profiles[i]), reverse=True)
            started = {i: pool.submit(make_profile, profiles[i], maker, out, say, run) for i in order}
            futures = [started[i] for i in range(len(profiles))]
            results = []
            errors: list[str] = []
            for profile, future in zip(profiles, futures, strict=True):
                try:
                    results.append(future.result())
                except KilnError as exc:
                    errors.append(f"{profile.name}: {exc}")
    if errors:
        raise BuildError("\n".join(errors))
    return results
