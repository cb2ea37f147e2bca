"""`kiln kernel menuconfig|olddefconfig|savedefconfig`: config work in the kernel's build container.

The kernel package's own build root (its variant's base, its dependencies, its sources placed)
is opened like `kiln shell` does; the package's first step's `prepare` snippets unpack the
source to /tmp/build/linux; then pkgs/kernel/kconfig.sh (the same script the build runs)
merges config-<arch> with the selected fragments and runs `make olddefconfig`. menuconfig
then runs interactively on the caller's terminal, and `make savedefconfig` gives the minimal
form that is written back to pkgs/kernel/config-<arch>.

Fragments stay separate: when `kernel_fragments` selects any, config-<arch> is not rewritten
(that would fold the fragments into it); `--output` still saves the full resolved .config.
The kernel's Kconfig is a host program, so any --arch is configured in the host's build root
(with ARCH=<karch>); only building a kernel for another arch needs that arch's root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kiln.build.session import Session, failures
from kiln.core.console import say_line
from kiln.core.errors import BuildError, InputError
from kiln.kconfig import config as kconfig
from kiln.pkg.model import Package

PACKAGE = "kernel"
ACTIONS = ("menuconfig", "olddefconfig", "savedefconfig")
KARCH = {"amd64": "x86", "arm64": "arm64"}

SOURCE = "/tmp/build/linux"  # where the kernel package's first `prepare` unpacks the source
TOOL = "/tmp/build/.kiln-kernel"  # what this module adds to the root: config, fragments, script
OBJ = f"{TOOL}/obj"


@dataclass
class Result:
    """What a run produced: the minimal and the full config, and where the minimal one went."""

    defconfig: str
    full: str
    written: Path | None
    changed: bool


def config_path(package: Package, arch: str) -> Path:
    return package.directory / f"config-{arch}"


def run(session: Session, action: str, arch: str, output: Path | None = None) -> Result:
    """Run `action` for `arch` in the kernel's build container; write config-<arch> back."""
    package, base, fragments = _checked_request(session, action, arch)
    _build_needs(session, package)

    store = session.store
    store.tmp_dir.mkdir(parents=True, exist_ok=True)
    log_dir = store.root / "logs" / "kernel-config"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "last.log"
    karch = KARCH[arch]
    env = session.builder.env(package.steps[0].env if package.steps else ())
    env["ARCH"] = karch
    with tempfile.TemporaryDirectory(dir=store.tmp_dir, prefix="kernel-config-") as work, log.open("wb") as out:
        with contextlib.closing(session.builder.prepare_root(package, Path(work) / "root")) as root:
            _place_tool(package, base, root.build_dir / TOOL.removeprefix("/tmp/build/"))
            scripts = [s for s in (package.steps[0].prepare if package.steps else ())]
            frag_arg = ",".join(fragments)
            scripts.append(
                f"KCONFIG_BASE_CHECK=warn sh {TOOL}/kconfig.sh {SOURCE} {OBJ} {karch} {TOOL}/config "
                f"{TOOL}/fragments '{frag_arg}'"
            )
            for script in scripts:
                _step(root.run(script, env, out, network=False), script, log)
            if action == "menuconfig":
                env["TERM"] = os.environ.get("TERM", "linux")
                code = root.shell(env, ["make", "-C", SOURCE, f"O={OBJ}", f"ARCH={karch}", "menuconfig"])
                if code != 0:
                    raise BuildError(f"menuconfig exited with code {code}; {base} left unchanged")
            save = f"make -s -C {SOURCE} O={OBJ} ARCH={karch} savedefconfig"
            _step(root.run(save, env, out, network=False), save, log)
            got = Path(work) / "out"
            if root.finalize([(f"{OBJ}/defconfig", "/defconfig"), (f"{OBJ}/.config", "/config")], got, out) != 0:
                raise BuildError(f"could not copy the config out of the build root; see {log}")
        _echo_notes(log)
        defconfig = (got / "defconfig").read_text()
        full = (got / "config").read_text()
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(full)
    if fragments:  # the config with fragments applied is not the base config: leave config-<arch> alone
        return Result(defconfig, full, None, False)
    return Result(defconfig, full, base, _write_back(base, defconfig))


def _checked_request(session: Session, action: str, arch: str) -> tuple[Package, Path, list[str]]:
    """The kernel package, its config-<arch> and the fragment names, or an InputError saying what is wrong."""
    if action not in ACTIONS:
        raise InputError(f"unknown kernel action {action!r}: choose one of {', '.join(ACTIONS)}")
    if arch not in KARCH:
        raise InputError(f"unknown arch {arch!r}: choose one of {', '.join(KARCH)}")
    graph = session.graph
    if PACKAGE not in graph.tree.packages:
        raise InputError(f"the package tree {graph.tree.root} has no '{PACKAGE}' package")
    package = graph.tree.packages[PACKAGE]
    base = config_path(package, arch)
    if not base.is_file():
        raise InputError(f"{base} does not exist: start one from the kernel's defconfig (docs/custom-kernel.md)")
    fragments = kconfig.fragment_names(str(graph.tree.package_context(package).get("kernel_fragments", "")))
    if action == "menuconfig" and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise InputError("menuconfig needs a terminal: run it from an interactive shell")
    return package, base, fragments


def _write_back(base: Path, defconfig: str) -> bool:
    """Keep the base config's header, replace the rest with the new defconfig; True if the file changed."""
    old = base.read_text()
    new = kconfig.header(old) + defconfig
    if new == old:
        return False
    base.write_text(new)
    return True


def _build_needs(session: Session, package: Package) -> None:
    """Build what the kernel's root stands on (the toolchain), or at least make the seed."""
    needs = [d for d in session.graph.closure([package.name]) if d != package.name]
    if needs:
        from kiln.build.progress import PlainProgress

        outcomes = session.build(
            needs, jobs=os.cpu_count() or 1, no_cache=False, keep_going=False, progress=PlainProgress(sys.stderr)
        )
        if failures(outcomes):
            raise BuildError(f"a dependency of '{package.name}' failed to build")
    elif session.needs_seed([package.name]):
        session.bootstrap(say_line)


def _place_tool(package: Package, base: Path, into: Path) -> None:
    """The config to work on, the fragments and kconfig.sh, from the package directory."""
    into.mkdir(parents=True, exist_ok=True)
    shutil.copy2(base, into / "config")
    shutil.copy2(package.directory / "kconfig.sh", into / "kconfig.sh")
    fragments = package.directory / "fragments"
    if fragments.is_dir():
        shutil.copytree(fragments, into / "fragments")
    else:
        (into / "fragments").mkdir()


def _step(code: int, script: str, log: Path) -> None:
    if code != 0:
        lines = log.read_text(errors="replace").splitlines()[-30:]
        raise BuildError(
            f"kernel config step failed (exit code {code}):\n    {script.strip()}\n"
            f"--- last {len(lines)} lines of {log} ---\n" + "\n".join(lines)
        )


def _echo_notes(log: Path) -> None:
    """kconfig.sh's own lines (what was merged, warnings, the summary) for the user."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("kconfig:"):
            say_line(line)
