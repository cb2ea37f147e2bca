"""A run's downloads start at once, and the sizes they reveal decide which ready package starts first.

Why: packages fetched their sources when their build began, so a cold run downloaded the
kernel's 138 MB only once toolchain-seed was done, and with two workers and the ready queue in
build order the kernel (the longest build by far) waited behind six small packages. Fetching
every remote source of the packages to build in the background as the run starts overlaps the
downloads with the seed's bootstrap; and the bytes of a package's remote sources are the one
cost Kiln knows before building it (what a build unpacks and compiles: the kernel's source is
17 times util-linux's), so the scheduler starts the ready package with the heaviest chain first
(kiln.build.scheduler). A failed prefetch changes nothing: the build fetches again and reports.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable

from kiln.build.builder import Builder
from kiln.build.sources.download import fetch_all
from kiln.core.errors import KilnError, Location
from kiln.pkg.model import Source


def remote_sources(builder: Builder, names: Iterable[str]) -> list[tuple[Source, Location]]:
    """Every remote source of `names`, with where each is declared (for the fetcher's errors)."""
    found: list[tuple[Source, Location]] = []
    for name in names:
        package = builder.graph.tree.packages[name]
        for s_index, step in enumerate(package.steps):
            for index, source in enumerate(step.sources):
                if not source.is_local:
                    line = package.line(("steps", s_index, "sources", index))
                    found.append((source, Location(str(package.file), line)))
    return found


def start(builder: Builder, names: list[str]) -> threading.Thread | None:
    """Fetch the remote sources of `names` in a daemon thread; None when there is nothing to fetch."""
    sources = remote_sources(builder, names)
    if not sources:
        return None

    def fetch() -> None:
        with contextlib.suppress(KilnError):  # each build fetches its own sources again and reports
            fetch_all(builder.fetcher, sources)

    thread = threading.Thread(target=fetch, name="kiln-prefetch", daemon=True)
    thread.start()
    return thread


def source_bytes(builder: Builder) -> Callable[[str], int]:
    """A package's weight: the bytes of its remote sources fetched so far (0 for what is not there)."""

    def weigh(name: str) -> int:
        total = 0
        for source, _ in remote_sources(builder, [name]):
            path = builder.fetcher.path_for(source.sha256 or "")
            total += path.stat().st_size if source.sha256 and path.is_file() else 0
        return total

    return weigh
