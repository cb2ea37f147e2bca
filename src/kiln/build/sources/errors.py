"""Errors of fetching, checking and placing sources."""

from __future__ import annotations

from kiln.core.errors import KilnError, Location


class FetchError(KilnError):
    """A source could not be fetched, did not match its sha256, or is an unsafe archive."""

    exit_code = 1


class FetchErrors(FetchError):
    """Several sources failed in one pass; each is reported on its own line(s)."""

    def __init__(self, errors: list[KilnError]) -> None:
        ordered = sorted(errors, key=lambda e: (e.location or Location(""), e.message))
        super().__init__("\n".join(str(e) for e in ordered))
        self.errors = ordered


class Miss(Exception):
    """A place that did not have the file; the text says why, for the final error."""
