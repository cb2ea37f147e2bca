"""Whether this host can run a cross build's target programs (its `test` snippets do).

A cross build's test snippets run target binaries. The kernel runs them through a binfmt_misc
handler (qemu-user-static) registered with the F flag: QEMU is opened at registration, so the
handler also works inside the sandbox's mount namespace, where the host's /usr is not visible.
"""

from __future__ import annotations

from pathlib import Path

BINFMT = Path("/proc/sys/fs/binfmt_misc")


def cannot_run_reason(carch: str, binfmt: Path = BINFMT) -> str | None:
    """None when `carch` programs run here; otherwise why not, for the build log and progress."""
    entry = binfmt / f"qemu-{carch}"
    try:
        text = entry.read_text()
    except OSError:
        return (
            f"no binfmt handler for {carch} programs ({entry} is missing): install qemu-user-static "
            "and run scripts/setup-host.sh, which registers it"
        )
    lines = text.splitlines()
    if not lines or lines[0].strip() != "enabled":
        return f"the binfmt handler {entry} is disabled"
    flags = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags:")), "")
    if "F" not in flags:
        return f"the binfmt handler {entry} lacks the F flag, so the sandbox cannot reach its interpreter"
    return None
