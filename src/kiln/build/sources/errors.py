"""Errors of fetching, checking and placing sources."""

from __future__ import annotations

from kiln.core.errors import KilnError, SeveralErrors


class FetchError(KilnError):
    """A source could not be fetched, did not match its sha256, or is an unsafe archive."""

    exit_code = 1


class FetchErrors(SeveralErrors, FetchError):
    """Several sources failed in one pass; each is reported on its own line(s)."""


class Miss(Exception):
    """A place that did not have the file; the text says why, for the final error."""
