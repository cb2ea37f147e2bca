"""JSON Schemas (pkg.yaml, stage0.yaml, profiles) and their errors turned into messages people read.

The schema file is the single contract: the loader validates with it, the docs
describe it, and tests check every shipped pkg.yaml against it.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import fastjsonschema

if TYPE_CHECKING:  # jsonschema only explains failures: imported when a document is wrong
    import jsonschema

from kiln.core.yamlfile import Path_

_TYPE_NAMES = {
    "string": "a string",
    "array": "a list",
    "object": "a mapping",
    "boolean": "true or false",
    "number": "a number",
    "integer": "an integer",
}


def _type_of(value: Any) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


@cache
def load_schema(name: str = "pkg.schema.json", package: str = "kiln.pkg") -> dict[str, Any]:
    """A schema shipped inside the kiln package (`package` is the module directory holding it)."""
    text = resources.files(package).joinpath(name).read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator(name: str, package: str) -> jsonschema.Draft202012Validator:
    import jsonschema

    schema = load_schema(name, package)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def suggest(word: str, choices: list[str] | set[str]) -> str:
    """A ' (did you mean ...?)' suffix, or nothing."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _field(path: Path_) -> str:
    """The last named part of a path, with any index after it: 'build[0]'."""
    for i in range(len(path) - 1, -1, -1):
        if isinstance(path[i], str):
            return _dotted(path[i:])
    return "value"


def _dotted(path: Path_) -> str:
    """('steps', 0, 'sources') -> 'steps[0].sources', as a user would point at it."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _messages(error: jsonschema.ValidationError) -> Iterator[tuple[Path_, str]]:
    path: Path_ = tuple(error.absolute_path)
    value: Any = error.instance
    wanted: Any = error.validator_value
    schema = error.schema if isinstance(error.schema, dict) else {}
    custom = schema.get("x-message")
    where = f" in {_dotted(path)}" if path else ""
    if error.validator == "additionalProperties":
        allowed = set(schema.get("properties", {}))
        for key in value:
            if key not in allowed:
                yield (*path, str(key)), f"unknown key {str(key)!r}{where}{suggest(str(key), allowed)}"
    elif error.validator == "required":
        for key in wanted:
            if key not in value:
                yield path, f"missing required key '{key}'{where}"
    elif error.validator == "type":
        names = [_TYPE_NAMES.get(str(t), str(t)) for t in (wanted if isinstance(wanted, list) else [wanted])]
        hint = " (quote it)" if wanted == "string" and isinstance(value, bool | int | float) else ""
        yield path, f"{_field(path)} must be {' or '.join(names)}, not {_type_of(value)}{hint}"
    elif custom and error.validator in ("pattern", "enum", "oneOf", "minProperties", "maxProperties"):
        yield path, custom.format(value=value, field=_field(path))
    else:
        yield path, f"{_field(path)}: {error.message}"


@cache
def _fast_check(name: str, package: str) -> Any:
    """A compiled validator for the common case: the document is fine.

    fastjsonschema generates Python code from the schema and is ~50x quicker, but it
    stops at the first error and its messages are terse; jsonschema explains failures.
    Our schema only uses keywords with the same meaning in draft-07, which it compiles.
    """
    schema = {**load_schema(name, package), "$schema": "http://json-schema.org/draft-07/schema#"}
    return fastjsonschema.compile(schema)


def validate(instance: Any, name: str = "pkg.schema.json", package: str = "kiln.pkg") -> list[tuple[Path_, str]]:
    """All schema violations as (path, message), in document order."""
    try:
        _fast_check(name, package)(instance)
        return []
    except fastjsonschema.JsonSchemaException as exc:
        fast = exc
    found: list[tuple[Path_, str]] = []
    for error in _validator(name, package).iter_errors(instance):
        found.extend(_messages(error))
    if not found:
        # The two validators disagree (their regex dialects differ): refusing is the safe side.
        path = _fast_path(fast)
        found.append((path, f"{_field(path)}: {fast}"))
    return found


def _fast_path(exc: fastjsonschema.JsonSchemaException) -> Path_:
    """fastjsonschema's error path ('data', 'steps', 0, ...) without its root name."""
    parts = list(getattr(exc, "path", []) or [])[1:]
    return tuple(p if isinstance(p, int) else str(p) for p in parts)
