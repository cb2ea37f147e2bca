"""Image profiles (profiles/<name>.yaml): what to build, how to customise it, which output to write.

A profile is checked like a pkg.yaml: its JSON Schema (profile.schema.json) first, then the
rules a schema cannot say (options that only fit one output kind, what an arch cannot boot);
every problem is an InputError naming `file:line`, all of them at once.

Arch: the profile's `arch:` when it has one, else `kiln image --platform`'s, else amd64. A profile
whose `arch:` disagrees with --platform is refused (resolve_platform), and the arch rules run
again for the arch --platform gave: arm64 machines boot UEFI only, so an arm64 output cannot
have BIOS firmware, nor be an OVA (its OVF describes a BIOS x86 virtual machine). Several
platforms at once: kiln.image.multiarch. A file input (input.kernel.path, input.initramfs.path)
may name one file per arch; Profile.for_arch picks the arch's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kiln.core import schema
from kiln.core.errors import InputError, InputErrors, Location
from kiln.core.sizes import parse_size
from kiln.core.yamlfile import Positioned, read_yaml_file
from kiln.image.assets import ARCH_FIRMWARE
from kiln.image.outputs.kinds import KINDS
from kiln.image.profile_rules import DEFAULT_ARCH, arch_rules, rules
from kiln.image.schematic import Schematic
from kiln.pkg.variables import Platform
from kiln.rootfs.assemble import BASE_ROOTFS

# Where an embedded machine config lands in the rootfs; the command line names it (kiln.config=).
CONFIG_PATH = "/usr/lib/kiln/machine-config.json"
_IMAGE_EXTENSIONS = {"raw": "raw", "qcow2": "qcow2", "vhd": "vhd", "vmdk": "vmdk", "ova": "ova"}
# A signed boot chain is only as strong as the kernel it starts: locked down (no unsigned code into
# the kernel, no raw memory or MSR access) and loading only modules signed with the module key.
LOCKDOWN_ARGS = ["lockdown=integrity", "module.sig_enforce=1"]
# The kernel's console when a profile names none: the 8250 UART on amd64, the PL011 on arm64
# (QEMU's virt machine, most ARM servers and the arm64 clouds but AWS).
DEFAULT_KERNEL_ARGS = {"amd64": ("console=ttyS0",), "arm64": ("console=ttyAMA0",)}
# Outputs a boot loader boots take, on arm64, GRUB's EFI modules from this package.
GRUB_ARM64 = "grub-efi-arm64"
KernelArgs = tuple[str, ...] | dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class Asset:
    """A boot asset: built from a package, or a file the user already has."""

    package: str | None = None
    path: Path | None = None


@dataclass(frozen=True)
class KeysRef:
    """Where a profile says its signing keys are: a directory, or an environment variable naming one."""

    path: Path | None = None
    env: str | None = None


# input.kernel.path / input.initramfs.path given per arch: (key, ((arch, file), ...)), in the file's order
ArchFiles = tuple[tuple[str, tuple[tuple[str, Path], ...]], ...]


@dataclass(frozen=True)
class Profile:
    name: str
    file: Path
    arch: str
    platform: str
    version: str  # empty until with_release_version fills it from the graph
    kernel: Asset
    initramfs: Path | None
    init: str
    rootfs: tuple[str, ...]
    packages: tuple[str, ...]
    extensions: tuple[str, ...]
    custom_kernel_args: KernelArgs | None  # customization.kernel_args: a list, or one per arch
    machine_config: dict[str, Any] | None
    kind: str
    disk_size: int
    disk_format: str
    custom_file_name: str | None  # output.image.file_name; default: artifact_name
    out_format: str
    custom_firmware: tuple[str, ...] | None = None  # output.firmware, when the profile sets it
    arch_given: bool = False  # the file says `arch:` (else --platform or the default chose it)
    arch_files: ArchFiles = ()  # file inputs given per arch; kernel.path / initramfs hold this arch's
    keys: KeysRef | None = None  # the signing keys (kiln image --keys wins)
    secureboot: bool = False  # boot through the signed chain (kiln.image.outputs.secureboot)
    extra_kernel_args: tuple[str, ...] = ()  # a schematic's, after the profile's own
    schematic: Schematic | None = None  # kiln image --schematic: what customised this profile
    positions: Positioned = field(compare=False, repr=False, default_factory=lambda: Positioned({}, {}))

    def location(self, *path: str | int) -> Location:
        """file:line of a field, for errors found after loading (unknown packages)."""
        return Location(str(self.file), self.positions.line(path))

    @property
    def platform_spec(self) -> str:
        return f"linux/{self.arch}"

    @property
    def kernel_args(self) -> tuple[str, ...]:
        """The profile's kernel arguments for its arch; an arch it names none for gets DEFAULT_KERNEL_ARGS."""
        custom = self.custom_kernel_args
        if isinstance(custom, dict):
            custom = custom.get(self.arch)
        return DEFAULT_KERNEL_ARGS[self.arch] if custom is None else custom

    @property
    def firmware(self) -> tuple[str, ...]:
        """The firmware the output boots from: output.firmware, else all its arch has (amd64 BIOS + UEFI);
        UEFI alone under Secure Boot (BIOS has none)."""
        return self.custom_firmware or (("uefi",) if self.secureboot else ARCH_FIRMWARE[self.arch])

    @property
    def loader_package(self) -> str | None:
        """The package the boot loader's modules come from: none on amd64 (the host's GRUB)."""
        return GRUB_ARM64 if self.arch == "arm64" and KINDS[self.kind].boot == "loader" else None

    @property
    def signed_boot(self) -> bool:
        """Whether the firmware verifies this profile's boot chain (a Secure Boot output, or a kind the
        firmware starts itself: a UKI): its kernel then runs locked down and its modules are signed."""
        return self.secureboot or KINDS[self.kind].boot == "firmware"

    def cmdline(self) -> str:
        """The kernel command line: the profile's arguments, the platform, the embedded config."""
        args = [*self.kernel_args, *self.extra_kernel_args, f"kiln.platform={self.platform}"]
        if self.signed_boot:
            args += LOCKDOWN_ARGS
        if self.machine_config is not None:
            args.append(f"kiln.config={CONFIG_PATH}")
        return " ".join(args)

    @property
    def artifact_stem(self) -> str:
        """`<platform>-<arch>[-secureboot]`: what this profile's artifacts are named after, as the peers
        name theirs (metal-amd64.raw.zst, aws-arm64.raw.zst, metal-amd64-secureboot.iso)."""
        return f"{self.platform}-{self.arch}" + ("-secureboot" if self.secureboot else "")

    @property
    def installer_name(self) -> str:
        """The installer's OCI layout directory (and, with .tar, its archive): installer-<arch>[-secureboot]."""
        return f"installer-{self.arch}" + ("-secureboot" if self.secureboot else "")

    @property
    def file_name(self) -> str:
        """The disk file's name before out_format's compression: `<stem>.<format>` unless the profile names it."""
        return self.custom_file_name or f"{self.artifact_stem}.{_IMAGE_EXTENSIONS[self.disk_format]}"

    @property
    def artifact_name(self) -> str:
        """The one file this profile's kind writes, compressed as out_format asks ("" for pxe and the
        installer, which write a set of files): what the imager names it and the factory serves."""
        compressed = "" if self.out_format == "raw" else self.out_format
        pattern = KINDS[self.kind].artifact  # outputs.kinds
        return pattern.format(arch=self.arch, stem=self.artifact_stem, file_name=self.file_name, compressed=compressed)

    def for_arch(self, arch: str) -> Profile:
        """This profile for `arch`: its file inputs given per arch become that arch's file (None when the
        mapping names none: `missing_files` says so)."""
        files = {key: dict(per_arch).get(arch) for key, per_arch in self.arch_files}
        kernel = Asset(path=files["kernel"]) if "kernel" in files else self.kernel
        return replace(self, arch=arch, kernel=kernel, initramfs=files.get("initramfs", self.initramfs))

    def missing_files(self) -> list[InputError]:
        """File inputs given per arch that name no file for this profile's arch, at their lines."""
        return [
            InputError(
                f"input.{key}.path names a file for {', '.join(dict(files))} only, not {self.arch}: add "
                f"{self.arch}: <file> (or build it for {', '.join(f'linux/{a}' for a in dict(files))})",
                self.location("input", key, "path"),
            )
            for key, files in self.arch_files
            if self.arch not in dict(files)
        ]

    def asset_packages(self) -> list[str]:
        """Every package this profile's kernel and initramfs are made from, in a stable order."""
        names: list[str] = []
        if self.kernel.package:
            names.append(self.kernel.package)
        if self.initramfs is None:
            names += [self.init, *self.rootfs, *self.packages, *self.package_extensions]
        return list(dict.fromkeys(names))

    @property
    def package_extensions(self) -> tuple[str, ...]:
        """The extensions that are packages of the tree (the rest are oci:// references, pulled)."""
        return tuple(name for name in self.extensions if not name.startswith("oci://"))

    @property
    def oci_extensions(self) -> tuple[str, ...]:
        return tuple(name for name in self.extensions if name.startswith("oci://"))

    def packages_to_build(self) -> list[str]:
        """The asset packages and the boot loader's (arm64's GRUB), in a stable order."""
        names = self.asset_packages()
        return list(dict.fromkeys([*names, self.loader_package])) if self.loader_package else names


def load_profile(file: Path) -> Profile:
    """Read and check one profile; raises InputError(s) with file:line."""
    where = str(file)
    positioned = read_yaml_file(file, what="profile")
    data = positioned.value
    if not isinstance(data, dict):
        raise InputError("a profile must be a mapping", Location(where, 1))
    problems = schema.validate(data, "profile.schema.json", "kiln.image")
    problems += [] if problems else rules(data)
    if problems:
        raise InputErrors([InputError(msg, Location(where, positioned.line(path))) for path, msg in problems])
    return _build(data, file, positioned)


def _asset_path(value: str, file: Path) -> Path:
    path = Path(value)
    return path if path.is_absolute() else (file.parent / path)


def _build(data: dict[str, Any], file: Path, positioned: Positioned) -> Profile:
    inputs = data.get("input", {})
    output = data["output"]
    image = output.get("image", {})
    custom = data.get("customization", {})
    arch = data.get("arch", DEFAULT_ARCH)
    paths: dict[str, Path | None] = {"kernel": None, "initramfs": None}
    arch_files: list[tuple[str, tuple[tuple[str, Path], ...]]] = []
    for key in paths:
        given = inputs.get(key, {}).get("path")
        files = given.items() if isinstance(given, dict) else [] if given is None else [(None, given)]
        for file_arch, value in files:
            path = _asset_path(value, file)
            if not path.is_file():
                where = ("input", key) if file_arch is None else ("input", key, "path", file_arch)
                raise InputError(f"input.{key}: no such file {path}", Location(str(file), positioned.line(where)))
        if isinstance(given, dict):
            arch_files.append((key, tuple((a, _asset_path(v, file)) for a, v in given.items())))
        elif given is not None:
            paths[key] = _asset_path(given, file)
    kernel_in = inputs.get("kernel", {"package": "kernel"})
    kernel = Asset(kernel_in.get("package"), paths["kernel"])
    initramfs = paths["initramfs"]
    disk_format = image.get("format", "raw")
    kernel_args = custom.get("kernel_args")
    if isinstance(kernel_args, dict):
        kernel_args = {arch: tuple(args) for arch, args in kernel_args.items()}
    elif kernel_args is not None:
        kernel_args = tuple(kernel_args)
    profile = Profile(
        name=data.get("name", file.stem),
        file=file,
        arch=arch,
        platform=data["platform"],
        version=str(data.get("version", "")),
        kernel=kernel,
        initramfs=initramfs,
        init=inputs.get("init", "init"),
        rootfs=tuple(inputs.get("rootfs", BASE_ROOTFS)),
        packages=tuple(inputs.get("packages", [])),
        extensions=tuple(inputs.get("extensions", [])),
        custom_kernel_args=kernel_args,
        machine_config=custom.get("machine_config"),
        kind=output["kind"],
        disk_size=parse_size(image.get("disk_size", "1GiB")),
        disk_format=disk_format,
        custom_file_name=image.get("file_name"),
        out_format=output.get("out_format", "raw"),
        custom_firmware=tuple(output["firmware"]) if "firmware" in output else None,
        arch_given="arch" in data,
        arch_files=tuple(arch_files),
        keys=_keys_ref(data.get("keys"), file),
        secureboot=bool(data.get("secureboot", False)),
        positions=positioned,
    )
    profile = profile.for_arch(arch)
    raise_all(profile.missing_files() if "arch" in data else [])
    return profile


def _keys_ref(given: dict[str, str] | None, file: Path) -> KeysRef | None:
    if given is None:
        return None
    return KeysRef(path=_asset_path(given["path"], file)) if "path" in given else KeysRef(env=given["env"])


def resolve_platform(profiles: list[Profile], platform: str | None) -> list[Profile]:
    """The profiles for `kiln image --platform` (None: not given, each keeps its own arch).

    A profile without `arch:` takes --platform's arch, and what that arch cannot boot is refused
    at the profile's lines; one whose `arch:` disagrees is refused at that line. All at once.
    """
    if platform is None:
        raise_all([e for profile in profiles for e in profile.missing_files()])
        return profiles
    arch = Platform.parse(platform).arch
    errors: list[InputError] = []
    resolved: list[Profile] = []
    for profile in profiles:
        if profile.arch_given and profile.arch != arch:
            errors.append(
                InputError(
                    f"arch {profile.arch} disagrees with --platform {platform}: a profile's arch and --platform "
                    "must agree (leave arch out of the profile to let --platform choose)",
                    profile.location("arch"),
                )
            )
            continue
        if profile.arch != arch:
            profile = profile.for_arch(arch)
            problems = arch_rules(
                arch,
                profile.kind,
                list(profile.custom_firmware or []),
                profile.disk_format,
                f" (--platform {platform})",
            )
            errors += [InputError(message, profile.location(*path)) for path, message in problems]
        errors += profile.missing_files()
        resolved.append(profile)
    raise_all(errors)
    return resolved


def apply_schematic(profile: Profile, schematic: Schematic) -> Profile:
    """The profile customised by the schematic: its extensions after the profile's, its kernel arguments
    after the profile's, its machine config in place of the profile's."""
    if profile.initramfs is not None and schematic.extensions:
        raise InputError(
            f"profile {profile.name} takes a ready-made initramfs: a schematic's extensions cannot be added to it",
            profile.location("input", "initramfs"),
        )
    config = schematic.machine_config(profile.platform)
    return replace(
        profile,
        extensions=tuple(dict.fromkeys((*profile.extensions, *schematic.extensions))),
        extra_kernel_args=(*profile.extra_kernel_args, *schematic.kernel_args(profile.platform)),
        machine_config=config if config is not None else profile.machine_config,
        schematic=schematic,
    )


def raise_all(errors: list[InputError]) -> None:
    """Nothing when `errors` is empty; else the one error, or all of them."""
    if errors:
        raise errors[0] if len(errors) == 1 else InputErrors(list(errors))


def find_profile(ref: str, profiles_dir: Path) -> Path:
    """A profile named by path (anything with '/' or ending .yaml) or by name in profiles_dir."""
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        path = Path(ref)
        if not path.is_file():
            raise InputError(f"no such profile file: {ref}")
        return path
    path = profiles_dir / f"{ref}.yaml"
    if path.is_file():
        return path
    names = sorted(p.stem for p in profiles_dir.glob("*.yaml")) if profiles_dir.is_dir() else []
    known = f"; profiles in {profiles_dir}: {', '.join(names)}" if names else f" ({profiles_dir} has none)"
    raise InputError(f"unknown profile '{ref}'{schema.suggest(ref, set(names))}{known}")


def load_profiles(refs: list[str], profiles_dir: Path) -> list[Profile]:
    """Load every named profile, reporting all their errors together; names must not collide."""
    profiles: list[Profile] = []
    errors: list[InputError] = []
    for ref in refs:
        try:
            profiles.append(load_profile(find_profile(ref, profiles_dir)))
        except InputErrors as many:
            errors += [e for e in many.errors if isinstance(e, InputError)]
        except InputError as one:
            errors.append(one)
    seen: dict[str, Profile] = {}
    for profile in profiles:
        if profile.name in seen:
            errors.append(
                InputError(
                    f"profile name '{profile.name}' is also used by {seen[profile.name].file}: "
                    "their outputs would overwrite each other",
                    Location(str(profile.file)),
                )
            )
        seen[profile.name] = profile
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise InputErrors(list(errors))
    return profiles
