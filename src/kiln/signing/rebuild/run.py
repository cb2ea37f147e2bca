"""The phases of `kiln verify --rebuild`: read and refuse, check out, build each directory, compare.

Everything that can refuse does so before anything is checked out or built (a dirty tree, a
secret the provenance redacted, a commit the repository lacks, a malformed record), every reason
at once, exit 2. Then each recorded commit is checked out once, each output directory is made
again by that checkout's `kiln image` in a process of its own, into one store of its own (a new
temporary one unless --store names one: never the default store), and each rebuilt directory is
compared with the release. Each phase is timed. The work directory goes away afterwards unless
--keep; when something differs its reports stay, and the outcome names where.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kiln import __version__
from kiln.core.console import say_line
from kiln.core.errors import BuildError, InputError, InputErrors, KilnError
from kiln.core.paths import cache_dir
from kiln.signing.rebuild.checkout import (
    Kiln,
    Repository,
    checked_out,
    find_profile,
    image_argv,
    kiln_of,
    pulls_a_cache,
    repository,
    require_commit,
)
from kiln.signing.rebuild.compare import Compared, compare_directory, write_reports
from kiln.signing.rebuild.recorded import Recorded, output_directories, parse, read_statement, refusals
from kiln.signing.release import MAX_PROVENANCE, PROVENANCE, VerificationError, read_signed

Say = Callable[[str], None]
OWN_STOP_SECONDS = 10  # how long an interrupted kiln image gets to stop on the terminal's signal alone
STOP_SECONDS = 60  # ... and after a SIGTERM, before it is killed


@dataclass(frozen=True)
class Options:
    """What the command line asked for."""

    release: Path
    project_root: Path
    key: Ed25519PublicKey | None = None
    store: Path | None = None
    runner: str | None = None
    allow_dirty: bool = False
    keep: bool = False
    schematic: Path | None = None
    progress: str | None = None


@dataclass
class Phase:
    name: str  # checkout, build, compare
    subject: str  # the commit, the profile, or ''
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {"phase": self.name, "subject": self.subject, "seconds": round(self.seconds, 2)}


@dataclass
class Directory:
    """One output directory of the release: its record, plain verification's problems, the comparison."""

    recorded: Recorded
    problems: list[str]
    compared: Compared | None = None
    rebuilt_by: str = ""  # whose Kiln, and its version
    inputs_differ: list[str] = field(default_factory=list)  # recorded inputs the rebuild's provenance disagrees on

    @property
    def ok(self) -> bool:
        return not self.problems and self.compared is not None and not self.compared.differences


@dataclass
class Outcome:
    directories: list[Directory]
    work: Path
    store: Path
    phases: list[Phase] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # what stays on disk afterwards

    @property
    def ok(self) -> bool:
        return all(directory.ok for directory in self.directories)

    @property
    def reports(self) -> Path:
        return self.work / "reports"


def rebuild(options: Options, say: Say = say_line) -> Outcome:
    """Rebuild every output directory of options.release and compare (see the module docstring)."""
    store = options.store.resolve() if options.store else None
    if store is not None and store == cache_dir().resolve():
        raise InputError(f"--store {store}: that is the store Kiln builds in; a rebuild needs one of its own")
    directories = read_all(options)
    repo = repository(options.project_root)
    for commit in dict.fromkeys(d.recorded.commit for d in directories):
        require_commit(repo, str(commit))
    work = Path(tempfile.mkdtemp(prefix="kiln-rebuild-"))
    outcome = Outcome(directories, work, store or work / "store")
    try:
        _rebuild_all(options, repo, outcome, say)
    finally:
        _clean(outcome, options)
    return outcome


def read_all(options: Options) -> list[Directory]:
    """Each output directory's record (verified first with a key), or every reason none can be rebuilt."""
    found: list[Directory] = []
    errors: list[KilnError] = []
    for directory in output_directories(options.release):
        try:
            data, problems = read_statement(directory, options.key)
            recorded = parse(directory, data)
        except InputErrors as many:
            errors += many.errors
            continue
        except InputError as one:
            errors.append(one)
            continue
        reasons = refusals(recorded, allow_dirty=options.allow_dirty, schematic_given=options.schematic is not None)
        errors += [InputError(reason) for reason in reasons]
        found.append(Directory(recorded, problems))
    names = [d.recorded.name for d in found]
    errors += [
        InputError(f"two directories record the profile {n}: rebuild them one at a time")
        for n in set(names)
        if names.count(n) > 1
    ]
    if errors:
        raise errors[0] if len(errors) == 1 else InputErrors(errors)
    return found


@contextlib.contextmanager
def timed(outcome: Outcome, name: str, subject: str, say: Say) -> Iterator[None]:
    """Time one phase into the outcome, and say when it ends."""
    began = time.monotonic()
    yield
    seconds = time.monotonic() - began
    outcome.phases.append(Phase(name, subject, seconds))
    say(f"rebuild: {name}{' ' + subject if subject else ''}: {seconds:.1f} s")


def _rebuild_all(options: Options, repo: Repository, outcome: Outcome, say: Say) -> None:
    _note_store(outcome)
    with contextlib.ExitStack() as stack:
        checkouts: dict[str, Path] = {}
        for commit in dict.fromkeys(str(d.recorded.commit) for d in outcome.directories):
            say(f"rebuild: checking out {commit[:12]}")
            with timed(outcome, "checkout", commit[:12], say):
                where = outcome.work / f"checkout-{commit[:12]}"
                checkouts[commit] = stack.enter_context(checked_out(repo, commit, where, keep=options.keep))
        # every profile found before the first build: a missing one fails in seconds, not after a kernel
        profiles = [find_profile(checkouts[str(d.recorded.commit)], repo, d.recorded) for d in outcome.directories]
        rebuilt: list[Path] = []
        for index, (directory, profile) in enumerate(zip(outcome.directories, profiles, strict=True), start=1):
            name = directory.recorded.name
            say(f"rebuild: building {name} ({index} of {len(outcome.directories)})")
            with timed(outcome, "build", name, say):
                checkout = checkouts[str(directory.recorded.commit)]
                rebuilt.append(_build(directory, checkout, profile, repo, outcome, options, say))
        with timed(outcome, "compare", "", say):
            for directory, made in zip(outcome.directories, rebuilt, strict=True):
                _compare(directory, made, options, outcome)


def _build(
    directory: Directory, checkout: Path, profile: Path, repo: Repository, outcome: Outcome, options: Options, say: Say
) -> Path:
    """Run the checkout's kiln image on `profile` for one directory; the directory it made."""
    recorded = directory.recorded
    project = checkout / repo.project if repo.project else checkout
    out = outcome.work / "out" / recorded.name
    schematic = _schematic_file(recorded, options, outcome.work)
    runner = options.runner or recorded.runner
    kiln = kiln_of(checkout)
    argv = image_argv(recorded, profile, out, runner=runner, schematic=schematic, no_cache=pulls_a_cache(project))
    directory.rebuilt_by = f"{kiln.whose} Kiln" + (f" {__version__}" if kiln.pythonpath is None else "")
    say(f"rebuild: {recorded.name}: {directory.rebuilt_by} runs kiln image (runner {runner}, store {outcome.store})")
    log = outcome.work / "logs" / f"{recorded.name}.stdout"
    code = run_kiln([*kiln.argv, *argv], project, _environment(kiln, outcome.store, options), log)
    if code != 0:
        raise BuildError(
            f"{recorded.name}: kiln image of commit {str(recorded.commit)[:12]} failed (exit {code}); "
            "what it said is above" + ("" if options.keep else " (--keep keeps its checkout and store)")
        )
    _note_build(directory, options, outcome)
    return _made(out)


def _schematic_file(recorded: Recorded, options: Options, work: Path) -> Path | None:
    """The schematic to apply: --schematic's, else the recorded fields written out (JSON is YAML)."""
    if recorded.schematic is None:
        return None
    if options.schematic is not None:
        return options.schematic.resolve()
    path = work / f"{recorded.name}.schematic.json"
    path.write_text(json.dumps(recorded.schematic.fields, indent=2, ensure_ascii=False) + "\n")
    return path


def _environment(kiln: Kiln, store: Path, options: Options) -> dict[str, str]:
    """The rebuild's environment: this one, with its own store, the checkout's Kiln first on the path,
    and no $KILN_VERSION (the recorded version is given with --set)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KILN_CACHE", "KILN_VERSION")}
    env["KILN_CACHE"] = str(store)
    if kiln.pythonpath is not None:
        env["PYTHONPATH"] = kiln.pythonpath
    if options.progress:
        env["KILN_PROGRESS"] = options.progress
    return env


def run_kiln(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> int:
    """Run kiln (its progress on this process's stderr, its stdout into `log`) and wait; an interrupt
    gives it STOP_SECONDS to stop its own steps before it is killed."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as stdout:
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout)
        try:
            return process.wait()
        except BaseException:
            _stop(process)
            raise


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop an interrupted kiln: a terminal's Ctrl-C reached it too, so it gets a moment to stop on its own
    (a second signal would make it exit at once), then SIGTERM, then SIGKILL after STOP_SECONDS."""
    for signum in (None, signal.SIGTERM):
        if signum is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)
        try:
            process.wait(timeout=OWN_STOP_SECONDS if signum is None else STOP_SECONDS)
            return
        except subprocess.TimeoutExpired:
            continue
    process.kill()
    process.wait()


def _made(out: Path) -> Path:
    """The one output directory kiln image wrote into `out`."""
    made = sorted(Path(e.path) for e in os.scandir(out) if e.is_dir(follow_symlinks=False) and e.name[0] != ".")
    if len(made) != 1:
        raise BuildError(f"{out}: kiln image wrote {len(made)} output directories, not one")
    return made[0]


def _compare(directory: Directory, made: Path, options: Options, outcome: Outcome) -> None:
    """Digests of the release and the rebuild, then reports for what differs, and the inputs behind it."""
    recorded = directory.recorded
    try:
        compared = compare_directory(recorded.directory, options.release, recorded.subjects, made)
    except VerificationError as exc:
        directory.problems += exc.problems
        return
    directory.compared = compared
    if compared.differences:
        reports = outcome.reports / recorded.name
        write_reports(recorded.directory, made, compared.differences, reports, outcome.work / "scratch")
        directory.inputs_differ = inputs_differ(recorded, made)


def inputs_differ(recorded: Recorded, made: Path) -> list[str]:
    """The recorded inputs (resolvedDependencies by name) whose digests the rebuild's provenance does not
    share: what to look at first when an artifact differs. Empty when the rebuild wrote no provenance."""
    try:
        again = parse(made, read_signed(made, PROVENANCE, MAX_PROVENANCE))
    except (InputError, InputErrors, VerificationError):
        return []
    names = recorded.dependencies.keys() | again.dependencies.keys()
    return sorted(n for n in names if recorded.dependencies.get(n) != again.dependencies.get(n))


def _note_store(outcome: Outcome) -> None:
    store = outcome.store
    store.mkdir(parents=True, exist_ok=True)
    if any(store.iterdir()):
        outcome.notes.append(f"the store {store} held entries already: what it had was not built again (not cold)")


def _note_build(directory: Directory, options: Options, outcome: Outcome) -> None:
    """What the summary must say about how this rebuild differs from the original run."""
    recorded = directory.recorded
    if options.runner and options.runner != recorded.runner:
        outcome.notes.append(f"{recorded.name}: built with the {options.runner} runner, recorded {recorded.runner}")
    if recorded.dirty:
        outcome.notes.append(f"{recorded.name}: made from a dirty tree; rebuilt from its commit (--allow-dirty)")
    if recorded.seed_tarball:
        outcome.notes.append(
            f"{recorded.name}: its seed was a tarball; the rebuild uses what the checkout's stage0.yaml says "
            "(a kiln --from-tar archive is not replayed)"
        )
    if "running" in directory.rebuilt_by and recorded.kiln_version != __version__:
        outcome.notes.append(
            f"{recorded.name}: the checkout holds no Kiln; rebuilt with Kiln {__version__}, "
            f"made with {recorded.kiln_version}"
        )


def _clean(outcome: Outcome, options: Options) -> None:
    """Remove the work directory, but what --keep keeps and the reports of what differs."""
    if options.keep:
        outcome.kept.append(str(outcome.work))
        checkouts = sorted(str(p) for p in outcome.work.glob("checkout-*"))
        outcome.notes += [
            f"the checkout {path} stays a worktree: git worktree remove --force {path}" for path in checkouts
        ]
        return
    for name in ("out", "store", "scratch", "logs"):
        shutil.rmtree(outcome.work / name, ignore_errors=True)
    if outcome.reports.is_dir():
        outcome.kept.append(str(outcome.reports))
    else:
        shutil.rmtree(outcome.work, ignore_errors=True)


def as_json(outcome: Outcome) -> dict[str, Any]:
    """The outcome as `--json` prints it."""
    return {
        "ok": outcome.ok,
        "directories": [_directory_json(d) for d in outcome.directories],
        "phases": [phase.as_json() for phase in outcome.phases],
        "store": str(outcome.store),
        "reports": str(outcome.reports) if outcome.reports.is_dir() else None,
        "kept": outcome.kept,
        "notes": outcome.notes,
    }


def _directory_json(directory: Directory) -> dict[str, Any]:
    recorded, compared = directory.recorded, directory.compared
    return {
        "directory": str(recorded.directory),
        "profile": recorded.name,
        "commit": recorded.commit,
        "platforms": list(recorded.platforms),
        "runner": recorded.runner,
        "rebuilt_by": directory.rebuilt_by,
        "same": compared.same if compared else [],
        "differences": [d.as_json() for d in compared.differences] if compared else [],
        "problems": directory.problems,
        "inputs_differ": directory.inputs_differ,
    }


def summary_lines(outcome: Outcome) -> tuple[list[str], list[str]]:
    """What the text output says: (lines for stdout, lines naming each problem for stderr)."""
    out: list[str] = []
    err: list[str] = []
    for directory in outcome.directories:
        recorded, compared = directory.recorded, directory.compared
        platforms = ", ".join(recorded.platforms)
        what = f"{recorded.name} from {str(recorded.commit)[:12]} ({platforms}, {directory.rebuilt_by})"
        if directory.ok and compared is not None:
            out.append(f"rebuilt {what}: {len(compared.same)} artifacts, each the same as the release's")
            continue
        out.append(f"rebuilt {what}: NOT the same as the release")
        err += [f"{recorded.name}: {problem}" for problem in directory.problems]
        for difference in compared.differences if compared else []:
            report = f" (report: {difference.report})" if difference.report else ""
            err.append(f"{recorded.name}/{difference.artifact}: {'; '.join(difference.what)}{report}")
        if directory.inputs_differ:
            err.append(f"{recorded.name}: inputs the rebuild did not share: {', '.join(directory.inputs_differ)}")
    phases = ", ".join(f"{p.name}{' ' + p.subject if p.subject else ''} {p.seconds:.1f} s" for p in outcome.phases)
    out.append(f"phases: {phases}")
    out += [f"note: {note}" for note in outcome.notes]
    out += [f"kept: {path}" for path in outcome.kept]
    return out, err
