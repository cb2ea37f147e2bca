"""Name -> sha256 listings, SHA256SUMS' lines (kiln.signing.release) and a provenance's subjects
(kiln.signing.attestation), read by one rule: each name stands once."""

from __future__ import annotations

from collections.abc import Callable


def digests_by_name(
    entries: list[tuple[str, str, str | None]], twice: Callable[[str, int], str]
) -> tuple[dict[str, str], dict[int, str]]:
    """name -> sha256 of parsed (name, sha256, problem) entries, and each bad entry's problem by its index.

    A repeated name is a problem too, which `twice` words from the name and the index of its first
    entry; the caller says where an index is (a line, a subject), so both files keep their messages.
    """
    digests: dict[str, str] = {}
    first: dict[str, int] = {}
    problems: dict[int, str] = {}
    for index, (name, digest, problem) in enumerate(entries):
        if problem is None and name in first:
            problem = twice(name, first[name])
        if problem is not None:
            problems[index] = problem
            continue
        digests[name] = digest
        first[name] = index
    return digests, problems
