"""Jinja2 rendering of pkg.yaml files, with errors placed on template lines.

Users edit the template, not its rendering, so every error must point at a
template line. Template errors carry their own line; for YAML and schema errors
found in the rendered text we map rendered lines back to template lines with a
line diff, computed only when an error needs it.
"""

from __future__ import annotations

import difflib
import traceback
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import jinja2.nodes

from kiln.errors import InputError, InputErrors, Location
from kiln.paths import cache_dir

_SOURCES: dict[str, str] = {}


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept on disk, keyed by source checksum: a warm load skips
    Jinja's lexer, parser and code generator, which dominate loading a tree."""
    directory = cache_dir() / "jinja"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(directory))


_ENV = jinja2.Environment(
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
    loader=jinja2.FunctionLoader(lambda name: (_SOURCES[name], name, lambda: False)),
    cache_size=0,
    bytecode_cache=_bytecode_cache(),
)

_MARKERS = ("{{", "{%", "{#")


def is_template(source: str) -> bool:
    """Plain YAML skips Jinja entirely: most of a tree's files need no rendering."""
    return any(marker in source for marker in _MARKERS)


class Rendered:
    """A rendered template and the way back from its lines to the template's."""

    def __init__(self, source: str, text: str) -> None:
        self.source = source
        self.text = text

    @cached_property
    def _line_map(self) -> list[int]:
        src = self.source.splitlines()
        out = self.text.splitlines()
        mapping = [0] * (len(out) + 1)
        matcher = difflib.SequenceMatcher(None, src, out, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            for j in range(j1, j2):
                if tag == "equal":
                    mapping[j] = i1 + (j - j1)
                elif tag == "replace":
                    mapping[j] = i1 + min(j - j1, i2 - i1 - 1)
                else:  # insert: lines made by a loop; blame the line before
                    mapping[j] = max(i1 - 1, 0)
        mapping[len(out)] = len(src)
        return mapping

    def template_line(self, rendered_line: int) -> int:
        """Map a 1-based line of the rendered text to the template's."""
        if self.text is self.source or rendered_line <= 0:
            return rendered_line
        index = min(rendered_line - 1, len(self._line_map) - 1)
        return self._line_map[index] + 1


def _undefined_names(source: str, file: Path, context: dict[str, Any]) -> list[InputError]:
    """All undefined variables with their lines, not only the first one hit."""
    ast = _ENV.parse(source)
    missing = jinja2.meta.find_undeclared_variables(ast) - context.keys()
    errors = []
    for node in ast.find_all(jinja2.nodes.Name):
        if node.ctx == "load" and node.name in missing:
            errors.append(InputError(f"undefined variable '{node.name}'", Location(str(file), node.lineno)))
    seen: set[tuple[str, int]] = set()
    unique = []
    for err in errors:
        key = (err.message, err.location.line if err.location else 0)
        if key not in seen:
            seen.add(key)
            unique.append(err)
    return unique


def render(source: str, file: Path, context: dict[str, Any]) -> Rendered:
    """Render `source`; raise InputError(s) located on template lines."""
    if not is_template(source):
        return Rendered(source, source)
    _SOURCES[str(file)] = source
    try:
        template = _ENV.get_template(str(file))
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"template syntax: {exc.message}", Location(str(file), exc.lineno)) from None
    finally:
        del _SOURCES[str(file)]
    try:
        return Rendered(source, template.render(context))
    except jinja2.UndefinedError as exc:
        # Only now pay for the full analysis, so every undefined name is reported at once.
        undefined = _undefined_names(source, file, context)
        if undefined:
            raise InputErrors(list(undefined)) from None
        raise InputError(f"undefined: {exc.message}", Location(str(file), _template_line(exc, str(file)))) from None
    except jinja2.TemplateError as exc:
        raise InputError(f"template error: {exc}", Location(str(file), _template_line(exc, str(file)))) from None


def _template_line(exc: BaseException, filename: str = "<template>") -> int:
    """Jinja rewrites tracebacks so template frames carry template lines."""
    line = 0
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename in (filename, "<template>") and frame.lineno:
            line = frame.lineno
    return line


def render_string(template: str, context: dict[str, Any]) -> str:
    """Render a one-off template (for `kiln eval`)."""
    try:
        return _ENV.from_string(template).render(context)
    except jinja2.TemplateError as exc:
        raise InputError(f"template error: {exc}") from None
