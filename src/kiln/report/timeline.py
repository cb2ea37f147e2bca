"""`kiln report timeline BUILD.json`: a build as a Gantt chart, its critical path marked.

BUILD.json is what `kiln build --json` prints: per package its status, when it started and
finished (seconds since the build began) and what it needed. Each package built (or failed) is
a bar; cached packages took no time and are counted in the title, not drawn. The critical path
is the chain that decided when the build ended: from the package that finished last, step to the
need that finished last among those built in this run, and so on back; shortening anything off
it would not have ended the build sooner. It follows dependency edges only: a package whose needs
were done but which waited for a free job (`--jobs`) shows that wait as a thin grey lead-in to its
bar, from the moment it was ready.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.core.errors import InputError
from kiln.report import plot

DRAWN = ("built", "failed", "cancelled")


@dataclass(frozen=True)
class Bar:
    """One package of the build as the chart draws it."""

    name: str
    status: str
    started: float
    finished: float
    needs: tuple[str, ...]
    ready: float = 0.0  # when its last need of this run finished: it could have started then

    @property
    def seconds(self) -> float:
        return max(0.0, self.finished - self.started)


@dataclass(frozen=True)
class Timeline:
    bars: list[Bar]  # in start order
    cached: list[str]
    critical: list[str]  # first to last

    @property
    def end(self) -> float:
        return max((b.finished for b in self.bars), default=0.0)


def load(path: Path) -> Timeline:
    """The timeline of a `kiln build --json` document; an InputError names what is missing."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise InputError(f"{path}: no such file (write one with kiln build --json ... > {path.name})") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a kiln build --json document: {exc}") from None
    packages = data.get("packages") if isinstance(data, dict) else None
    if not isinstance(packages, dict):
        raise InputError(f"{path}: not a kiln build --json document (no 'packages' mapping)")
    return timeline(packages, str(path))


def timeline(packages: dict[str, Any], where: str = "build JSON") -> Timeline:
    bars: list[Bar] = []
    cached: list[str] = []
    done = {
        name: float(record["finished"])
        for name, record in packages.items()
        if isinstance(record, dict) and isinstance(record.get("finished"), int | float)
    }
    for name, record in packages.items():
        if not isinstance(record, dict):
            raise InputError(f"{where}: package {name!r} is not a mapping")
        status = str(record.get("status", ""))
        if status == "cached":
            cached.append(name)
            continue
        if status not in DRAWN:
            continue  # skipped: never started
        started, finished = record.get("started"), record.get("finished")
        if not isinstance(started, int | float) or not isinstance(finished, int | float):
            raise InputError(
                f"{where}: package {name!r} has no start and finish times; "
                "they are recorded by kiln build --json since this version: build again"
            )
        needs = tuple(str(n) for n in record.get("needs", []))
        ready = max((done[n] for n in needs if n in done), default=0.0)
        bars.append(Bar(name, status, float(started), float(finished), needs, min(ready, float(started))))
    bars.sort(key=lambda b: (b.started, b.finished, b.name))
    return Timeline(bars, sorted(cached), critical_path(bars))


def critical_path(bars: list[Bar]) -> list[str]:
    """The chain of built packages that ended last, each step the need that finished last."""
    built = {b.name: b for b in bars if b.status == "built"}
    if not built:
        return []
    current: Bar | None = max(built.values(), key=lambda b: (b.finished, b.name))
    chain: list[str] = []
    while current is not None and current.name not in chain:
        chain.append(current.name)
        needs = [built[n] for n in current.needs if n in built]
        current = max(needs, key=lambda b: (b.finished, b.name)) if needs else None
    return chain[::-1]


def summary(line: Timeline) -> str:
    """The chart's story in text: totals and the critical path with each step's seconds."""
    by_name = {b.name: b for b in line.bars}
    built = [b for b in line.bars if b.status == "built"]
    failed = [b for b in line.bars if b.status != "built"]
    text = f"{len(built)} built, {len(line.cached)} cached"
    text += f", {len(failed)} failed" if failed else ""
    text += f"; the build took {line.end:.1f} s"
    if line.critical:
        steps = " -> ".join(f"{n} ({by_name[n].seconds:.1f} s)" for n in line.critical)
        text += f"\ncritical path: {steps}"
    return text


def draw(line: Timeline, fmt: str, title: str | None = None) -> bytes:
    """The Gantt chart as SVG or PNG: one bar per package built, the critical path in red.

    Each bar is an SVG group with the id `bar-<name>` (`critical-<name>` on the critical path),
    and its name is the row's label, so a reader, or a test, can find every package in the file.
    """
    if not line.bars:
        raise InputError("nothing was built in this run (every package was cached): no timeline to draw")
    from matplotlib.patches import Patch

    rows = len(line.bars)
    fig = plot.figure(10, 1.8 + 0.3 * rows, layout="constrained")
    ax = fig.add_subplot()
    critical = set(line.critical)
    for row, bar in enumerate(line.bars):
        on_path = bar.name in critical
        if bar.started - bar.ready > line.end / 400:
            ax.barh(row, bar.started - bar.ready, left=bar.ready, height=0.18, color=plot.GREY)
        colour = plot.RED if on_path else plot.BLUE if bar.status == "built" else plot.GREY
        (patch,) = ax.barh(
            row,
            max(bar.seconds, line.end / 400),
            left=bar.started,
            height=0.7,
            color=colour,
            hatch="//" if bar.status != "built" else None,
            edgecolor="white",
        ).patches
        patch.set_gid(f"{'critical' if on_path else 'bar'}-{bar.name}")
        ax.text(bar.finished + line.end / 200, row, f"{bar.seconds:.1f} s", va="center", fontsize=8, color="#333333")
    ax.set_yticks(range(rows), [b.name for b in line.bars])
    ax.invert_yaxis()
    ax.set_xlim(0, line.end * 1.08)
    ax.set_xlabel("seconds since the build started")
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    handles = [Patch(color=plot.BLUE, label="built")]
    if line.critical:
        path = " → ".join(line.critical)
        handles.append(Patch(color=plot.RED, label=textwrap.fill(f"critical path: {path}", 90)))
    if any(b.status != "built" for b in line.bars):
        handles.append(Patch(facecolor=plot.GREY, hatch="//", label="failed or cancelled"))
    if any(b.started - b.ready > line.end / 400 for b in line.bars):
        handles.append(Patch(color=plot.GREY, label="ready, waiting for a free job"))
    fig.legend(handles=handles, loc="outside lower left", frameon=False, fontsize=8)
    built = sum(1 for b in line.bars if b.status == "built")
    heading = title or "kiln build"
    cached = f", {len(line.cached)} cached (not drawn)" if line.cached else ""
    ax.set_title(f"{heading}: {built} package(s) built in {line.end:.1f} s{cached}", loc="left", fontsize=10)
    return plot.render(fig, fmt)
