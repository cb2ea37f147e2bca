"""An extension fits its image's kernel: the kernel range, the release its modules sit under, their vermagic.

The modules here are stand-ins: files holding a `.modinfo`-style `vermagic=` entry, which is all
the check reads (tests/e2e/test_system.py loads a real module built against kernel-build)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln.core.errors import BuildError, InputError
from kiln.pkg.model import Package
from kiln.rootfs.extension import Manifest, check_kernel, manifest_for, vermagic

RELEASE = "6.1.176"
MAGIC = f"{RELEASE} SMP preempt mod_unload modversions "


def module(path: Path, magic: str | None = MAGIC, extra: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    info = b"license=GPL\0" + (f"vermagic={magic}\0".encode() if magic is not None else b"") + b"name=x\0"
    path.write_bytes(b"\x7fELF" + bytes(60) + info + extra)
    return path


@pytest.fixture
def kernel(tmp_path: Path) -> Path:
    module(tmp_path / f"kernel/usr/lib/modules/{RELEASE}/kernel/drivers/net/e1000.ko")
    return tmp_path / "kernel"


def ext(tmp_path: Path, kernel_range: str | None = None) -> Manifest:
    return Manifest("drv", "1.0", "me", "a driver", ">=0.1", kernel_range)


def test_a_module_built_for_the_kernel_passes(tmp_path: Path, kernel: Path) -> None:
    module(tmp_path / f"drv/usr/lib/modules/{RELEASE}/extra/drv.ko")
    check_kernel(ext(tmp_path, ">=6.1,<6.2"), tmp_path / "drv", kernel)
    assert vermagic(tmp_path / f"drv/usr/lib/modules/{RELEASE}/extra/drv.ko") == MAGIC


def test_another_vermagic_is_refused_naming_both(tmp_path: Path, kernel: Path) -> None:
    module(tmp_path / f"drv/usr/lib/modules/{RELEASE}/extra/drv.ko", f"{RELEASE} SMP mod_unload ")
    with pytest.raises(BuildError) as caught:
        check_kernel(ext(tmp_path), tmp_path / "drv", kernel)
    assert str(caught.value) == (
        f"extension 'drv': /usr/lib/modules/{RELEASE}/extra/drv.ko was built for vermagic "
        f"'{RELEASE} SMP mod_unload ', this image's kernel has '{MAGIC}'; build it against this tree's "
        "kernel-build package"
    )


@pytest.mark.parametrize(
    ("magic", "extra"),
    [(None, b""), (MAGIC, b"\0vermagic=6.2.0 SMP \0")],
    ids=["none", "two that differ"],
)
def test_a_module_without_one_clear_vermagic_is_refused(
    tmp_path: Path, kernel: Path, magic: str | None, extra: bytes
) -> None:
    module(tmp_path / f"drv/usr/lib/modules/{RELEASE}/extra/drv.ko", magic, extra)
    with pytest.raises(BuildError, match="was built for vermagic None"):
        check_kernel(ext(tmp_path), tmp_path / "drv", kernel)


def test_a_module_for_another_release_is_refused(tmp_path: Path, kernel: Path) -> None:
    module(tmp_path / "drv/usr/lib/modules/6.1.99/extra/drv.ko")
    with pytest.raises(BuildError, match=r"6.1.99/extra/drv.ko is installed for kernel 6.1.99, .* is 6.1.176"):
        check_kernel(ext(tmp_path), tmp_path / "drv", kernel)


def test_a_compressed_module_is_refused(tmp_path: Path, kernel: Path) -> None:
    module(tmp_path / f"drv/usr/lib/modules/{RELEASE}/extra/drv.ko.xz")
    with pytest.raises(BuildError, match=r"drv.ko.xz is compressed; ship modules as plain .ko"):
        check_kernel(ext(tmp_path), tmp_path / "drv", kernel)


def test_the_kernel_range_is_checked_without_modules(tmp_path: Path, kernel: Path) -> None:
    (tmp_path / "svc/usr/local/bin").mkdir(parents=True)
    check_kernel(ext(tmp_path, ">=6.1"), tmp_path / "svc", kernel)
    with pytest.raises(BuildError, match=r"extension 'drv' needs kernel >=6.2,<6.3, this image's kernel is 6.1.176"):
        check_kernel(ext(tmp_path, ">=6.2,<6.3"), tmp_path / "svc", kernel)


def test_a_kernel_without_modules_cannot_take_a_module_extension(tmp_path: Path) -> None:
    (tmp_path / "bare/boot").mkdir(parents=True)
    module(tmp_path / f"drv/usr/lib/modules/{RELEASE}/extra/drv.ko")
    with pytest.raises(BuildError, match=r"has no single /usr/lib/modules/<release>"):
        check_kernel(ext(tmp_path), tmp_path / "drv", tmp_path / "bare")
    check_kernel(ext(tmp_path), tmp_path / "bare", tmp_path / "bare")  # no modules, no range: nothing to check


def test_a_bad_kernel_range_is_an_input_error_at_its_line(tmp_path: Path) -> None:
    pkg = tmp_path / "pkgs/drv/pkg.yaml"
    pkg.parent.mkdir(parents=True)
    pkg.write_text(
        "name: drv\nversion: '1'\nvariant: scratch\nextension:\n  author: me\n  compatibility: '>=0.1'\n"
        "  kernel: '6.1'\n"
    )
    from kiln.pkg.loader import load_package

    package: Package = load_package(pkg, {})
    with pytest.raises(InputError) as caught:
        manifest_for(package)
    assert str(caught.value) == f"{pkg}:7: extension 'drv': kernel '6.1' is not a version range like '>=6.1,<6.2'"


def test_modules_to_load_must_be_carried_by_the_extension_or_the_kernel(tmp_path: Path, kernel: Path) -> None:
    module(tmp_path / f"drv/usr/lib/modules/{RELEASE}/extra/acpi_call.ko")
    (kernel / f"usr/lib/modules/{RELEASE}/modules.builtin").write_text("kernel/drivers/virtio/virtio-pci.ko\n")
    carried = Manifest("drv", "1.0", "me", "", ">=0.1", None, ("acpi_call", "e1000", "virtio_pci"))
    check_kernel(carried, tmp_path / "drv", kernel)
    assert json.loads(carried.to_json())["modules"] == ["acpi_call", "e1000", "virtio_pci"]
    missing = Manifest("drv", "1.0", "me", "", ">=0.1", None, ("zfs",))
    with pytest.raises(BuildError, match=r"names module 'zfs' to load at boot, but neither it nor the kernel 6.1.176"):
        check_kernel(missing, tmp_path / "drv", kernel)
    assert "modules" not in json.loads(ext(tmp_path).to_json())  # none named: the manifest says nothing
