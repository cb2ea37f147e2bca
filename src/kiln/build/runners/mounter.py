"""Runs inside `unshare --mount`: mounts a build root's overlays, then execs a command or finalizes.

Usage: python -m kiln.build.runners.mounter PLAN... [COMMAND...], PLAN being the
arguments `encode` writes: counted lists, so no value (a spec path among them) can be
taken for a separator. Decoded, it is {"root": host dir, "links": host dir, "mounts":
[{"at": "/" or a dependency's `to`, "upper": ..., "work": ..., "lowers": [...]}],
"finalize": {"out": host dir, "copies": [[from, to], ...]} or None}.

A dependency's `to` is resolved here, inside the merged root the mounts below it made, as
chroot would (never with the host's view: a layer may hold `/x -> /etc`), and reaches the
overlay's options only through a link Kiln names, so no spec text is ever parsed as options.
Mounts vanish with this process's namespace. Errors are printed (no traceback) and give
exit code 125 (mounting) or 3 (finalize), which the runner reports with the log.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing, pathlib and json cost a step's start more than this module's whole work
if TYPE_CHECKING:
    from typing import Any

# This runs before every step: it imports only what the step's mounts need (kiln.core.paths
# for a nested `to`, the finalize copy for finalize), to keep a step's start cheap.

# What overlayfs's option parser splits on or unescapes; control characters break logs and /proc/mounts.
_OPTION_SEPARATORS = (":", ",", "\\")
MOUNT_FAILED = 125
FINALIZE_FAILED = 3


def overlay_options(lowers: list[str], upper: str, work: str) -> str:
    """The overlay mount options; refuses a path that would change their meaning.

    `lowerdir` is split on ':' and the options on ',', with '\\' escaping either: a path
    holding one could add a host directory as a layer (or as the writable upper).
    """
    for path in (*lowers, upper, work):
        if any(c in path for c in _OPTION_SEPARATORS) or any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
            from kiln.core.errors import BuildError

            raise BuildError(
                f"cannot pass {path!r} to an overlay mount: ':', ',', '\\' and control characters "
                "would change the mount options (move KILN_CACHE to a plain path)"
            )
    return f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}"


def mount_all(plan: dict[str, Any]) -> None:
    """Mount every overlay of the plan, `/` first, each nested one onto what is below it."""
    root: str = plan["root"]
    os.makedirs(root, exist_ok=True)
    for index, mount in enumerate(plan["mounts"]):
        lowers = list(mount["lowers"])
        target = root
        if mount["at"] != "/":
            from pathlib import Path

            from kiln.core.paths import join_inside

            resolved = join_inside(Path(root), mount["at"], what="dependency 'to'")
            resolved.mkdir(parents=True, exist_ok=True)  # existing components are resolved, the rest are new
            target = str(resolved)
            # Keep what the layers below already had at this path, named by a link of ours.
            below = os.path.join(plan["links"], f"below{index}")
            if os.path.lexists(below):
                os.unlink(below)
            os.symlink(target, below)
            lowers.append(below)
        options = overlay_options(lowers, mount["upper"], mount["work"])
        # mount's own message goes to the log (stderr); no shell, no spec text in the options.
        if os.spawnvp(os.P_WAIT, "mount", ["mount", "-t", "overlay", "kiln", "-o", options, target]) != 0:
            from kiln.core.errors import BuildError

            raise BuildError(f"mounting the build root's layers at {mount['at']} failed")


def encode(root: str, links: str, mounts: list[dict[str, Any]], final: dict[str, Any] | None) -> list[str]:
    """The plan as arguments: root, links, then counted mounts and finalize copies."""
    args = [root, links, str(len(mounts))]
    for mount in mounts:
        args += [mount["at"], mount["upper"], mount["work"], str(len(mount["lowers"])), *mount["lowers"]]
    if final is None:
        return [*args, "-1"]
    args += [str(len(final["copies"])), final["out"]]
    for source, to in final["copies"]:
        args += [source, to]
    return args


def decode(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """(the plan, the command after it) from what `encode` wrote."""
    items = iter(argv)
    plan: dict[str, Any] = {"root": next(items), "links": next(items), "mounts": [], "finalize": None}
    for _ in range(int(next(items))):
        at, upper, work = next(items), next(items), next(items)
        lowers = [next(items) for _ in range(int(next(items)))]
        plan["mounts"].append({"at": at, "upper": upper, "work": work, "lowers": lowers})
    copies = int(next(items))
    if copies >= 0:
        out = next(items)
        plan["finalize"] = {"out": out, "copies": [[next(items), next(items)] for _ in range(copies)]}
    return plan, list(items)


def main(argv: list[str]) -> int:
    plan, command = decode(argv)
    try:
        mount_all(plan)
    except Exception as exc:  # a message in the log, not a traceback
        _say(exc)
        return MOUNT_FAILED
    final = plan["finalize"]
    if final is not None:
        from pathlib import Path

        from kiln.core.treecopy import finalize_tree

        try:
            finalize_tree(Path(plan["root"]), [(s, t) for s, t in final["copies"]], Path(final["out"]))
        except Exception as exc:
            _say(exc)
            return FINALIZE_FAILED
        return 0
    os.execvp(command[0], command)


def _say(exc: Exception) -> None:
    """KilnErrors and OSErrors as their message; anything else with its type (it would be a bug)."""
    known = isinstance(exc, OSError) or hasattr(exc, "message")
    print(f"kiln: {exc}" if known else f"kiln: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
