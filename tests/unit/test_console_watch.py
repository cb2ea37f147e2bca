"""The boot harness's console judge (kiln.boot.console.watch, which kiln.boot.qemu re-exports), on a stand-in for QEMU.

Stub: a small Python program plays QEMU's serial console (lines on stdout, an exit code), so each
verdict (found, panic, exit, timeout, power-off) is checked in a second. The real path, QEMU booting
Kiln's images, is what tests/e2e exercises through the same function.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pytest

from kiln.boot.qemu import watch


def guest(script: str) -> list[str]:
    return [sys.executable, "-u", "-c", "import sys, time\n" + script]


def test_the_expected_line_ends_the_watch_and_stops_the_guest(tmp_path: Path) -> None:
    log, seen = tmp_path / "log" / "boot.log", list[str]()
    started = time.monotonic()
    result = watch(
        guest("print('booting'); print('machined ready: v1'); time.sleep(60)"), "machined ready", 30, log, seen.append
    )
    assert result.ok and result.reason == "found" and result.line == "machined ready: v1"
    assert time.monotonic() - started < 20  # the guest was stopped, not waited for
    assert seen == ["booting", "machined ready: v1"]
    text = log.read_text()
    assert text.startswith("# ") and text.endswith("\nbooting\nmachined ready: v1\n")


def test_a_panic_line_fails_at_once(tmp_path: Path) -> None:
    result = watch(guest("print('Kernel panic - not syncing: VFS'); time.sleep(60)"), "ready", 30, tmp_path / "l")
    assert not result.ok and result.reason == "kernel panic" and "VFS" in (result.line or "")


def test_an_exit_without_the_line_names_the_exit_code(tmp_path: Path) -> None:
    result = watch(guest("print('no luck'); sys.exit(3)"), "ready", 30, tmp_path / "l")
    assert not result.ok and result.reason == "QEMU exited with code 3" and result.tail == ["no luck"]


def test_silence_times_out(tmp_path: Path) -> None:
    result = watch(guest("time.sleep(60)"), "ready", 1.5, tmp_path / "l")
    assert not result.ok and result.reason == "timed out after 2 s"


def test_partial_lines_and_carriage_returns_are_joined_before_judging(tmp_path: Path) -> None:
    script = "sys.stdout.write('mach'); sys.stdout.flush(); time.sleep(0.3); print('ined ready\\r'); time.sleep(60)"
    result = watch(guest(script), "machined ready", 30, tmp_path / "l")
    assert result.ok and result.line == "machined ready"


def test_until_exit_waits_for_power_off_and_reports_it(tmp_path: Path) -> None:
    ok = watch(guest("print('ready'); time.sleep(0.5); print('bye')"), "ready", 30, tmp_path / "a", until_exit=True)
    assert ok.ok and ok.reason == "powered off" and ok.exit_code == 0 and ok.tail[-1] == "bye"
    unfinished = guest("print('ready'); time.sleep(0.3); sys.stdout.write('last words')")
    cut = watch(unfinished, "ready", 30, tmp_path / "c", until_exit=True)
    assert cut.tail[-1] == "last words" and (tmp_path / "c").read_text().endswith("last words\n")
    stuck = watch(guest("print('ready'); time.sleep(60)"), "ready", 2, tmp_path / "b", until_exit=True)
    assert not stuck.ok and stuck.reason == "the guest did not power off"


def test_keep_running_hears_of_the_line_at_once_and_waits_past_the_boot_timeout(tmp_path: Path) -> None:
    """What `kiln boot --api` and `--keep` do: the machine outlives the boot timeout."""
    heard: list[float] = []
    started = time.monotonic()
    script = "print('ready'); sys.stdout.flush(); time.sleep(2.5); print('bye')"
    result = watch(
        guest(script),
        "ready",
        1.0,
        tmp_path / "l",
        until_exit=True,
        on_found=lambda found: heard.append(time.monotonic() - started),
        exit_timeout=math.inf,
    )
    assert result.ok and result.reason == "powered off" and result.tail[-1] == "bye"
    assert heard and heard[0] < 2.0, "on_found came only after the guest stopped"
    assert time.monotonic() - started >= 2.5


def test_lines_after_the_expected_one_reach_the_log_file_while_the_guest_runs(tmp_path: Path) -> None:
    """The upgrade tests poll the log for a trial slot's "is the default now", printed after ready
    by a guest that keeps running: each line must be in the file as it completes, a partial one too."""
    import threading

    log = tmp_path / "l"
    script = (
        "print('ready'); sys.stdout.write('is the def'); sys.stdout.flush(); time.sleep(0.3)\n"
        "print('ault now'); sys.stdout.flush(); time.sleep(60)"
    )
    runner = threading.Thread(
        target=watch, args=(guest(script), "ready", 1.0, log), kwargs={"until_exit": True, "exit_timeout": 8.0}
    )
    runner.start()
    deadline = time.monotonic() + 30
    while not (log.exists() and "is the default now\n" in log.read_text()):
        assert time.monotonic() < deadline and runner.is_alive(), "the line never reached the log file"
        time.sleep(0.1)
    assert runner.is_alive(), "the line was written only once the guest was stopped"
    runner.join()


def test_kiln_boot_blank_disk_and_its_old_name(capsys: pytest.CaptureFixture[str]) -> None:
    from kiln.boot.command import blank_disk_size
    from kiln.core.errors import InputError

    assert blank_disk_size(argparse.Namespace(blank_disk="4G", old_disk=None)) == "4G"
    assert blank_disk_size(argparse.Namespace(blank_disk=None, old_disk=None)) is None
    assert blank_disk_size(argparse.Namespace(blank_disk=None, old_disk="2G")) == "2G"
    assert "--disk SIZE is now --blank-disk SIZE" in capsys.readouterr().err
    with pytest.raises(InputError, match="give one of them"):
        blank_disk_size(argparse.Namespace(blank_disk="4G", old_disk="2G"))


def test_network_options_join_the_user_network_after_the_api_forward() -> None:
    """The platform tests put a fake metadata service into the guest's network this way."""
    from kiln.boot.qemu import Machine

    machine = Machine(
        kernel=Path("k"), api_port=5555, net_options="net=168.0.0.0/7,guestfwd=tcp:169.254.169.254:80-cmd:x"
    )
    command = machine.command()
    netdev = command[command.index("-netdev") + 1]
    assert (
        netdev == "user,id=net0,hostfwd=tcp:127.0.0.1:5555-:50000,net=168.0.0.0/7,guestfwd=tcp:169.254.169.254:80-cmd:x"
    )
