"""Runs inside `unshare --mount`: mounts a build root's overlays, then execs a command or finalizes.

Usage: python -m kiln.build.runners.mounter PLAN [-- COMMAND...], PLAN being JSON:
{"root": host dir, "links": host dir, "mounts": [{"lowers": [...], "upper": ..., "work": ...,
"at": "/" or a dependency's `to`}], "finalize": {"copies": [[from, to], ...], "out": host dir}}.

A dependency's `to` is resolved here, inside the merged root the mounts below it made, as
chroot would (never with the host's view: a layer may hold `/x -> /etc`), and reaches the
overlay's options only through a link Kiln names, so no spec text is ever parsed as options.
Mounts vanish with this process's namespace. Errors are printed (no traceback) and give
exit code 125 (mounting) or 3 (finalize), which the runner reports with the log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from kiln.errors import BuildError, KilnError
from kiln.paths import join_inside

# What overlayfs's option parser splits on or unescapes; control characters break logs and /proc/mounts.
_OPTION_UNSAFE = re.compile(r"[:,\\\x00-\x1f\x7f]")
MOUNT_FAILED = 125
FINALIZE_FAILED = 3


def overlay_options(lowers: list[str], upper: str, work: str) -> str:
    """The overlay mount options; refuses a path that would change their meaning.

    `lowerdir` is split on ':' and the options on ',', with '\\' escaping either: a path
    holding one could add a host directory as a layer (or as the writable upper).
    """
    for path in (*lowers, upper, work):
        if _OPTION_UNSAFE.search(path):
            raise BuildError(f"cannot pass {path!r} to an overlay mount: ':', ',', '\\' and control characters "
                             "would change the mount options (move KILN_CACHE to a plain path)")
    return f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}"


def mount_all(plan: dict[str, Any]) -> None:
    """Mount every overlay of the plan, `/` first, each nested one onto what is below it."""
    root = Path(plan["root"])
    links = Path(plan["links"])
    for index, mount in enumerate(plan["mounts"]):
        lowers = list(mount["lowers"])
        target = join_inside(root, mount["at"], what="dependency 'to'")
        target.mkdir(parents=True, exist_ok=True)  # existing components are resolved, the rest are new
        if mount["at"] != "/":
            # Keep what the layers below already had at this path, named by a link of ours.
            below = links / f"below{index}"
            below.unlink(missing_ok=True)
            below.symlink_to(target)
            lowers.append(str(below))
        options = overlay_options(lowers, mount["upper"], mount["work"])
        result = subprocess.run(["mount", "-t", "overlay", "kiln", "-o", options, str(target)],
                                stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            raise BuildError(f"mounting the build root's layers at {mount['at']} failed: {result.stderr.strip()}")


def main(argv: list[str]) -> int:
    plan = json.loads(argv[0])
    command = argv[2:] if len(argv) > 1 and argv[1] == "--" else []
    try:
        mount_all(plan)
    except (KilnError, OSError) as exc:
        print(f"kiln: {exc}", file=sys.stderr, flush=True)
        return MOUNT_FAILED
    final = plan.get("finalize")
    if final is not None:
        from kiln.build.runners.finalize import finalize_tree

        try:
            finalize_tree(Path(plan["root"]), [(s, t) for s, t in final["copies"]], Path(final["out"]))
        except (KilnError, OSError) as exc:
            print(f"kiln: {exc}", file=sys.stderr, flush=True)
            return FINALIZE_FAILED
        return 0
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
