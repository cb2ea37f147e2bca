"""The recorded commit in a scratch worktree of the project's repository, and its own `kiln image`.

The rebuild runs the Kiln of the checkout (its src/kiln, when the repository is Kiln's own tree)
so the code that made the release is the code that makes it again; a project that holds no Kiln
(an extension's or a vendor's) is rebuilt with the Kiln running now, and the summary says which.
The checkout is `git worktree add --detach`, hooks off: the commit's files exactly, with the
repository's history beside them (the release version's git describe sees what the original run
saw). The profile is the file of that commit whose sha256 the provenance records, so a profile
edited since, or one that never was in the repository, is not taken for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kiln.core import nofollow
from kiln.core.errors import InputError, KilnError, printable
from kiln.core.gitstate import git
from kiln.core.project import PROFILES_DIR, load_project
from kiln.core.tools import run
from kiln.signing.rebuild.recorded import Recorded

MAX_PROFILE = 1 << 20  # bytes of a candidate profile file read to hash it
MAX_TRACKED = 200_000  # files of the commit looked through for the profile
PROFILE_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Repository:
    """The git work tree holding the current project, and the project's place in it."""

    top: Path
    project: str  # the project's directory below `top`, '' at the top


@dataclass(frozen=True)
class Kiln:
    """How to run a checkout's `kiln`: the command, the PYTHONPATH it needs, and whose Kiln it is."""

    argv: tuple[str, ...]
    pythonpath: str | None  # None: the environment's own
    whose: str  # "the checkout's" or "the running"


def repository(project_root: Path) -> Repository:
    """The repository of the current project; an InputError outside git."""
    top = git(project_root, "rev-parse", "--show-toplevel")
    if not top:
        raise InputError(
            f"{project_root}: not in a git repository, so no recorded commit can be checked out "
            "(run kiln verify --rebuild in the project that made the release)"
        )
    relative = project_root.resolve().relative_to(Path(top).resolve()).as_posix()
    return Repository(Path(top), "" if relative == "." else relative)


def require_commit(repo: Repository, commit: str) -> None:
    """`commit` (hex, checked by the reader) must be a commit of the repository."""
    if git(repo.top, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        raise InputError(
            f"commit {commit} is not in the repository at {repo.top}: fetch the branch or tag that holds it "
            "(git fetch), then run kiln verify --rebuild again"
        )


@contextlib.contextmanager
def checked_out(repo: Repository, commit: str, where: Path, *, keep: bool) -> Iterator[Path]:
    """`where`: a detached worktree of `commit`, removed afterwards unless `keep`."""
    git_argv = ["git", "-c", "core.hooksPath=/dev/null", "-C", str(repo.top)]
    run([*git_argv, "worktree", "add", "--detach", "--quiet", str(where), commit], what="git worktree add")
    try:
        yield where
    finally:
        if not keep:
            remove_worktree(repo, where)


def remove_worktree(repo: Repository, where: Path) -> None:
    """The worktree's files and git's record of it, even when `git worktree remove` refuses."""
    if git(repo.top, "worktree", "remove", "--force", str(where)) is None:
        shutil.rmtree(where, ignore_errors=True)
        git(repo.top, "worktree", "prune")


def find_profile(checkout: Path, repo: Repository, recorded: Recorded) -> Path:
    """The commit's file whose sha256 is the recorded profile's: profiles/<name>.yaml first, then any
    tracked YAML or JSON file (a profile named by its path)."""
    project = f"{repo.project}/" if repo.project else ""
    first = [f"{project}{PROFILES_DIR}/{recorded.name}{suffix}" for suffix in (".yaml", ".yml")]
    for rel in dict.fromkeys([*first, *tracked(checkout)]):
        if _sha256_in(checkout, rel) == recorded.profile_sha256:
            return checkout / rel
    raise InputError(
        f"{printable(str(recorded.directory))}: no file of commit {recorded.commit} is the profile it was made "
        f"from (sha256 {recorded.profile_sha256[:12]}): a profile from outside the repository cannot be rebuilt"
    )


def tracked(checkout: Path) -> list[str]:
    """The commit's YAML and JSON files, as git lists them (at most MAX_TRACKED are looked at)."""
    listed = run(["git", "-C", str(checkout), "ls-files", "-z"], what="git ls-files").stdout
    names = [raw.decode(errors="replace") for raw in listed.split(b"\0")[:MAX_TRACKED] if raw]
    return [name for name in names if name.endswith(PROFILE_SUFFIXES)]


def _sha256_in(top: Path, rel: str) -> str | None:
    """sha256 of regular file `top`/`rel`, read through no link and only when small; None otherwise."""
    try:
        info = nofollow.lstat_in(top, rel, what="checkout")
        if info is None or not stat.S_ISREG(info.st_mode) or info.st_size > MAX_PROFILE:
            return None
        return hashlib.sha256(nofollow.read_in(top, rel, limit=MAX_PROFILE, what="checkout")).hexdigest()
    except (OSError, nofollow.LinkRefused, ValueError):
        return None


def kiln_of(checkout: Path) -> Kiln:
    """The checkout's own Kiln (src/kiln, a regular file tree of the commit), else the running one."""
    try:
        info = nofollow.lstat_in(checkout, "src/kiln/cli.py", what="checkout")
    except nofollow.LinkRefused:
        info = None
    argv = (sys.executable, "-m", "kiln.cli")
    if info is not None and stat.S_ISREG(info.st_mode):
        return Kiln(argv, str(checkout / "src"), "the checkout's")
    return Kiln(argv, None, "the running")


def image_argv(
    recorded: Recorded, profile: Path, out: Path, *, runner: str, schematic: Path | None, no_cache: bool
) -> list[str]:
    """`kiln image`'s arguments to make `recorded` again: each value an argument of its own (`--opt=value`,
    so no value is read as an option), never a shell's word. `schematic` is the file to apply (the
    recorded fields written out, or --schematic's); `no_cache` turns off the project's cache_from:."""
    argv = ["image", str(profile), f"--platform={','.join(recorded.platforms)}", f"--out={out}"]
    argv += [f"--set={name}={value}" for name, value in recorded.variables]
    argv += [f"--extension={name}" for name in recorded.given_extensions]
    if schematic is not None:
        argv.append(f"--schematic={schematic}")
    if runner != "sandbox":  # every kiln image builds with the sandbox unless told; older ones know no --runner
        argv.append(f"--runner={runner}")
    if no_cache:
        argv.append("--cache-from=")  # a rebuild builds: nothing is pulled from a registry cache
    return argv


def pulls_a_cache(project: Path) -> bool:
    """Whether the checkout's project file sets cache_from: (its kiln image would pull what it can)."""
    try:
        return bool(load_project(project).cache_from)
    except (KilnError, OSError):
        return False
