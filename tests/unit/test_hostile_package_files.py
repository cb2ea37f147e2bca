"""Files the image side takes from package outputs for host tools (machined for `kiln install` and the
installer image, GRUB's arm64 EFI modules) are never taken through a link the package planted: each case
points one link at a canary outside the work dir."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from kiln.core.errors import InputError
from kiln.core.nofollow import LinkRefused
from kiln.image import imager
from kiln.image.arch import loader_for
from kiln.image.profile import load_profile, resolve_platform
from tests.unit.hostile_tree import Canary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def canary(tmp_path: Path) -> Canary:
    host = Canary(tmp_path / "host")
    program = host.root / "program"
    program.write_text(f"#!/bin/sh\ntouch {host.root}/ran\n")  # what a link would run as machined
    program.chmod(0o755)
    host.snapshot()
    return host


def test_machined_behind_a_link_is_refused_and_never_run(
    tmp_path: Path, canary: Canary, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """`kiln install` runs machined on the host: a package whose usr/sbin/machined links to a host program
    is refused by name, and that program does not run."""
    from kiln import cli
    from kiln.core.verb import Context
    from kiln.image import checks

    tree = tmp_path / "machined-pkg"
    (tree / "usr/sbin").mkdir(parents=True)
    (tree / "usr/sbin/machined").symlink_to(canary.root / "program")
    monkeypatch.setattr(Context, "graph", lambda ctx, platform=None: None)
    monkeypatch.setattr(checks, "check_packages", lambda profiles, graph: None)
    monkeypatch.setattr(checks, "with_release_version", lambda profiles, graph: profiles)
    monkeypatch.setattr(imager, "build_packages", lambda *a, **k: SimpleNamespace(trees={checks.MACHINED: tree}))
    monkeypatch.chdir(ROOT)
    image = tmp_path / "disk.raw"
    image.write_bytes(b"\0" * 4096)
    assert cli.main(["install", "--disk", str(tmp_path / "disk"), "--image", str(image)]) == 1
    assert "machined: /usr/sbin/machined is a symbolic link where Kiln needs a file" in capfd.readouterr().err
    assert not (canary.root / "ran").exists()
    canary.check()


def test_a_package_file_is_copied_only_when_it_is_the_packages_own(tmp_path: Path, canary: Canary) -> None:
    tree = tmp_path / "pkg"
    (tree / "usr").mkdir(parents=True)
    (tree / "usr/sbin").symlink_to(canary.root)
    with pytest.raises(LinkRefused, match="machined: /usr/sbin is a symbolic link where Kiln needs a directory"):
        imager.package_file(tree, "usr/sbin/program", tmp_path / "copy", 0o755, "machined")
    os.unlink(tree / "usr/sbin")
    (tree / "usr/sbin").mkdir()
    with pytest.raises(InputError, match=r"machined: /usr/sbin/machined does not exist in its output"):
        imager.package_file(tree, "usr/sbin/machined", tmp_path / "copy", 0o755, "machined")
    (tree / "usr/sbin/machined").write_text("#!/bin/sh\n")
    copied = imager.package_file(tree, "usr/sbin/machined", tmp_path / "copy", 0o755, "machined")
    assert copied.read_text() == "#!/bin/sh\n" and os.access(copied, os.X_OK)
    canary.check()


@pytest.mark.parametrize("linked", ["usr/lib/grub", "usr/lib/grub/arm64-efi", "usr/lib/grub/arm64-efi/normal.mod"])
def test_grub_modules_behind_a_link_are_refused(tmp_path: Path, canary: Canary, linked: str) -> None:
    """grub-mkimage reads the arm64 EFI modules with the host's view: no link on the way or below."""
    (tmp_path / "p.yaml").write_text("platform: metal\noutput:\n  kind: iso\n  firmware: [uefi]\n")
    arm64 = resolve_platform([load_profile(tmp_path / "p.yaml")], "linux/arm64")[0]
    store = tmp_path / "grub-efi-arm64"
    (store / "usr/lib/grub/arm64-efi").mkdir(parents=True)
    (store / "usr/lib/grub/arm64-efi/part_gpt.mod").write_bytes(b"mod")
    target = store / linked
    if target.is_dir():
        shutil.rmtree(target)
    target.symlink_to(canary.dir)
    with pytest.raises(LinkRefused, match=f"package 'grub-efi-arm64': /{linked} is a symbolic link"):
        loader_for(arm64, {"grub-efi-arm64": store})
    canary.check()
