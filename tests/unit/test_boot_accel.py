"""--accel auto: KVM only where it has booted Linux on this host, found once and remembered.

The probe here is a stub (a function answering yes or no, counting its calls): what it stands for,
a real first boot under KVM that must show the kernel's banner, runs in
tests/e2e/test_system.py::test_kiln_boot_accel_auto_finds_out_once_and_boots.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kiln.boot import accel
from kiln.boot.qemu import Machine


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("kiln.boot.accel.platform.machine", lambda: "x86_64")
    monkeypatch.setattr(accel, "host_key", lambda machine: "host-A")
    return tmp_path / "cache"


def prober(answer: bool, calls: list[str]) -> accel.Prober:
    def probe(machine: Machine, seconds: float) -> bool:
        calls.append(machine.accel)
        assert seconds == accel.PROBE_SECONDS
        return answer

    return probe


def test_given_accelerators_are_used_as_they_are() -> None:
    calls: list[str] = []
    for name in ("tcg", "kvm"):
        assert accel.choose(name, Machine(), prober(True, calls)) == accel.Choice(name, f"--accel {name}")
    assert calls == []


def test_another_arch_or_no_usable_kvm_device_means_tcg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    assert accel.choose("auto", Machine(arch="arm64"), prober(True, calls)).accel == "tcg"
    monkeypatch.setattr(accel, "KVM_DEVICE", tmp_path / "no-kvm")
    choice = accel.choose("auto", Machine(), prober(True, calls))
    assert choice.accel == "tcg" and "no-kvm is missing" in choice.why
    assert calls == []


def test_the_probe_runs_once_per_host_and_its_answer_is_kept(
    own_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = tmp_path / "kvm"
    device.write_text("")
    monkeypatch.setattr(accel, "KVM_DEVICE", device)
    calls: list[str] = []
    first = accel.choose("auto", Machine(), prober(False, calls))
    assert first.accel == "tcg" and "did not show the kernel's banner" in first.why
    again = accel.choose("auto", Machine(), prober(True, calls))  # remembered: no second probe
    assert again.accel == "tcg" and "hung before the kernel's banner" in again.why
    assert calls == ["kvm"]
    assert json.loads((own_cache / "boot/accel.json").read_text()) == {"host-A": False}
    monkeypatch.setattr(accel, "host_key", lambda machine: "host-B")  # a new kernel or QEMU: ask again
    assert accel.choose("auto", Machine(), prober(True, calls)).accel == "kvm"
    assert accel.choose("auto", Machine(), prober(False, calls)).accel == "kvm"
    assert calls == ["kvm", "kvm"]
    (own_cache / "boot/accel.json").write_text("not json")  # a broken cache is asked again, not trusted
    assert accel.choose("auto", Machine(), prober(False, calls)).accel == "tcg" and len(calls) == 3
