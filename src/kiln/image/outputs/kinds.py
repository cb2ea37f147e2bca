"""The output kinds: every fact about a kind in one entry, so a new kind is a writer module and a line here.

The profile schema's kind enum (a test holds it equal to KINDS), the profile rules, the artifact
names, the imager, the order profiles start in and the multi-arch merge all read this table; none
of them names a kind of its own. Pure data: it imports no writer, so reading it costs nothing, and
the imager imports a kind's writer only when a profile asks for that kind.

A writer is a module of kiln.image.outputs with `write(profile, assets, dest, trees)`: it writes
the kind's files into `dest` (an empty directory) from the boot assets and the store trees of the
packages built for the profiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from kiln.image.assets import BootAssets
    from kiln.image.profile import Profile

# How a kind boots: "loader" (GRUB boots it, the host's on amd64, grub-efi-arm64's on arm64),
# "firmware" (the firmware starts and verifies the one file itself, a UKI), None (it does not boot).
Boot = Literal["loader", "firmware"] | None


class Writer(Protocol):
    def __call__(self, profile: Profile, assets: BootAssets, dest: Path, trees: Mapping[str, Path]) -> None: ...


@dataclass(frozen=True)
class OutputKind:
    """One kind of output: what it is called, how it boots and signs, and what writes it."""

    name: str
    writer: str  # the module (under kiln.image.outputs) whose write() makes it
    # The one file it writes, a pattern over {arch}, {stem} (Profile.artifact_stem), {file_name} (the
    # disk's) and {compressed} (out_format's suffix); "" when it writes a set of files.
    artifact: str
    boot: Boot = None
    secureboot: bool = False  # `secureboot: true` can put it behind the signed chain (shim, GRUB, UKIs)
    grouped: bool = False  # its files name each other: several arches keep each arch's in <kind>-<arch>/
    # Seconds per profile, roughly (only the order of a run's profiles uses it); None: its disk's
    # format and compression decide (kiln.image.order).
    cost: float | None = 0.5
    packages: tuple[str, ...] = ()  # packages its writer takes from the store besides the profile's own

    @property
    def module(self) -> str:
        return f"kiln.image.outputs.{self.writer}"


# In the schema's order: the rules' messages list kinds in it.
KINDS: dict[str, OutputKind] = {
    kind.name: kind
    for kind in (
        OutputKind("iso", "iso", "{stem}.iso{compressed}", boot="loader", secureboot=True),
        OutputKind("image", "image", "{file_name}{compressed}", boot="loader", secureboot=True, cost=None),
        OutputKind("pxe", "pxe", "", boot="loader", grouped=True),
        # a disk, its gzip, and the gzip of the layer holding it
        OutputKind("installer", "installer", "", boot="loader", secureboot=True, cost=3.5, packages=("machined",)),
        OutputKind("kernel", "kernel", "kernel-{arch}"),
        OutputKind("initramfs", "initramfs", "initramfs-{arch}.zst"),
        # signed whenever the profile has keys, not through `secureboot: true`
        OutputKind("uki", "uki", "{stem}-uki.efi", boot="firmware"),
    )
}


def kinds_where(*, boot: Boot | None = None, secureboot: bool | None = None) -> tuple[str, ...]:
    """The kinds' names, in KINDS' order, that boot as `boot` and can be signed as `secureboot` says (None:
    either way)."""
    return tuple(
        name
        for name, kind in KINDS.items()
        if (boot is None or kind.boot == boot) and (secureboot is None or kind.secureboot == secureboot)
    )
