"""The `--json` of an upload's result, one convention for every cloud."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


def result_json(result: DataclassInstance) -> dict[str, Any]:
    """Every field of `result` in the order it declares them, its `seconds` per phase rounded to
    hundredths: a new field reaches --json without a second list to keep in step."""
    shown = {item.name: getattr(result, item.name) for item in fields(result)}
    if "seconds" in shown:
        shown["seconds"] = {phase: round(s, 2) for phase, s in shown["seconds"].items()}
    return shown
