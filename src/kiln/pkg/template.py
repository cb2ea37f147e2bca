"""Jinja2 rendering of pkg.yaml files, sandboxed and bounded, with errors placed on template lines.

Users edit the template, not its rendering, so every error must point at a
template line. Template errors carry their own line; for YAML and schema errors
found in the rendered text we map rendered lines back to template lines with a
line diff, computed only when an error needs it.

Templates come from package trees other people write and Kiln renders them as
root, so they run in Jinja's ImmutableSandboxedEnvironment (no attribute walks to
Python internals, no mutation of values) and within budgets (limits below): loop
iterations, call depth and count, the size of every string a template builds and
of all it outputs. `{% include %}`, `{% import %}` and `{% extends %}` are refused
when the template is parsed, so no template reads another file. Compiled templates
are kept in memory, and on disk only signed (kiln.pkg.codecache): an unsigned or
foreign cache file is never unmarshalled.

Over 400 lines on purpose: the signed cache names an entry by this file's source (and its own), so
everything that shapes compiled template code (the sandbox, its budgets, the AST rewrite) lives
here; moved elsewhere, a change to it would not invalidate cached templates.
"""

from __future__ import annotations

import difflib
import functools
import re
import threading
import traceback
import types
from collections.abc import Callable, Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import jinja2.nodes as nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from kiln.core.errors import InputError, InputErrors, Location
from kiln.pkg import codecache

MAX_RANGE = 10_000  # items in one range()
MAX_ITERATIONS = 100_000  # loop iterations in one render
MAX_CALL_DEPTH = 32  # nested calls: a recursive macro stops here
MAX_CALLS = 20_000  # calls in one render
MAX_VALUE = 1 << 20  # characters (or items) of one string or list a template makes
MAX_OUTPUT = 4 << 20  # characters one render may emit, macro bodies and loop bodies included
MAX_INT_BITS = 4096  # integers a template computes
_MAX_SOURCE_LINES_FOR_DIFF = 20_000

_UNSUPPORTED = {
    nodes.Extends: "extends",
    nodes.Include: "include",
    nodes.Import: "import",
    nodes.FromImport: "from ... import",
}


class TemplateLimit(SecurityError):
    """A template went past one of the render budgets."""


class _Budget(threading.local):
    """What the current render has spent; one per thread, reset for each render."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.iterations = 0
        self.calls = 0
        self.depth = 0
        self.output = 0

    def spend_output(self, size: int) -> None:
        self.output += size
        if self.output > MAX_OUTPUT:
            raise TemplateLimit(f"template output is larger than {MAX_OUTPUT} characters")


_BUDGET = _Budget()


def _size(value: Any, depth: int = 0) -> int:
    """An upper estimate of the text `value` turns into, cut off once it passes MAX_VALUE."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, list | tuple | dict | set | frozenset) and depth < 8:
        items = value.items() if isinstance(value, dict) else value
        total = 2
        for item in items:
            total += _size(item, depth + 1) + 4
            if total > MAX_VALUE:
                break
        return total
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 3 + 2
    return 64


def _check_value(value: Any, what: str = "value") -> Any:
    """Refuse a built string or list past MAX_VALUE, and integers past MAX_INT_BITS."""
    if isinstance(value, str | bytes | list | tuple) and len(value) > MAX_VALUE:
        raise TemplateLimit(f"{what} larger than {MAX_VALUE} characters or items")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise TemplateLimit(f"{what}: integer larger than {MAX_INT_BITS} bits")
    return value


def _ensure(estimate: int, what: str) -> None:
    if estimate > MAX_VALUE:
        raise TemplateLimit(f"{what} would be larger than {MAX_VALUE} characters")


_FORMAT_WIDTH = re.compile(r"[%:][^%:{}\s]*?\d{5,}|%[^a-zA-Z%]*\*|\{[^{}]*\{")


def _check_format(fmt: str, args: Iterable[Any]) -> None:
    """printf or str.format: no huge or indirect widths, and a bounded result."""
    if _FORMAT_WIDTH.search(fmt):
        raise TemplateLimit("format widths of 10000 or more, '*' widths and nested fields are not allowed")
    largest = max((_size(a) for a in args), default=0)
    _ensure(len(fmt) + (fmt.count("%") + fmt.count("{")) * (4 * largest + 64), "the formatted string")


def _format_args(right: Any) -> list[Any]:
    if isinstance(right, tuple):
        return list(right)
    if isinstance(right, dict):
        return list(right.values())
    return [right]


def _guard_binop(operator: str, left: Any, right: Any) -> None:
    """`*`, `**`, `+` and `%` are the operators that can build huge values from small ones."""
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "**" and ints and right > 0 and abs(left) > 1 and left.bit_length() * right > MAX_INT_BITS:
        raise TemplateLimit(f"{left} ** {right} is larger than {MAX_INT_BITS} bits")
    if operator == "*":
        if ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateLimit(f"product larger than {MAX_INT_BITS} bits")
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, str | bytes | list | tuple) and isinstance(count, int):
                _ensure(len(seq) * max(count, 0), "the repeated value")
    sequences = (str, bytes, list, tuple)
    if operator == "+" and isinstance(left, sequences) and isinstance(right, sequences):
        _ensure(len(left) + len(right), "the joined value")
    if operator == "%" and isinstance(left, str):
        _check_format(left, _format_args(right))


def _guard_str_method(name: str, owner: str | bytes, args: tuple[Any, ...]) -> None:
    """str methods whose result can dwarf their inputs."""
    if name in ("expandtabs", "translate", "maketrans"):
        raise TemplateLimit(f"str.{name} is not allowed in templates")
    if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        _ensure(args[0], f"str.{name}")
    if name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, str | bytes) and isinstance(new, str | bytes):
            hits = owner.count(old) if old else len(owner) + 1  # type: ignore[arg-type]
            _ensure(len(owner) + hits * max(len(new) - len(old), 0), "str.replace")
    if name == "join" and args:
        raise TemplateLimit("str.join is not allowed in templates: use the join filter")


# Filters whose integer arguments size what they build (widths, counts of items).
_SIZING_FILTERS = frozenset({"center", "indent", "wordwrap", "truncate", "batch", "slice", "round"})


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A built-in filter with its inputs checked first and its result after."""

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        passed = jinja2.runtime.Context | jinja2.Environment | jinja2.nodes.EvalContext
        values = [a for a in (*args, *kwargs.values()) if not isinstance(a, passed)]
        if name in _SIZING_FILTERS:
            for value in values[1:]:
                if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_RANGE:
                    raise TemplateLimit(f"filter {name}: argument {value} is larger than {MAX_RANGE}")
        _estimate_filter(name, values)
        return _check_value(func(*args, **kwargs), f"filter {name}")

    return guarded


def _estimate_filter(name: str, values: list[Any]) -> None:
    """Filters whose output grows with an argument: estimate before running them."""
    if not values:
        return
    subject = values[0]
    text = subject if isinstance(subject, str) else ""
    ints = [v for v in values[1:] if isinstance(v, int)]
    strings = [v for v in values[1:] if isinstance(v, str)]
    widest = max(ints, default=0)
    if name == "indent":
        _ensure(len(text) + (text.count("\n") + 1) * (widest + max((len(s) for s in strings), default=0)), name)
    elif name in ("center", "wordwrap"):
        _ensure(max(len(text), widest) * (1 + max((len(s) for s in strings), default=0)), name)
    elif name == "replace" and len(strings) >= 2:
        old, new = strings[0], strings[1]
        hits = text.count(old) if old else len(text) + 1
        _ensure(len(text) + hits * max(len(new) - len(old), 0), name)
    elif name == "format":
        _check_format(text, values[1:])
    elif name == "join" and isinstance(subject, list | tuple):
        _ensure(_size(subject) + len(subject) * max((len(s) for s in strings), default=0), name)


def _range(*args: int) -> range:
    """range() with at most MAX_RANGE items: range(10**9) fails at once, not after a long loop."""
    items = range(*args)
    try:
        count = len(items)
    except OverflowError:
        count = MAX_RANGE + 1
    if count > MAX_RANGE:
        raise TemplateLimit(f"range() of more than {MAX_RANGE} items")
    return items


def _each(iterable: Any, weight: int = 0) -> Iterator[Any]:
    """Every loop iterates through this: counts iterations, and the loop body's text as output."""
    for item in iterable:
        _BUDGET.iterations += 1
        if _BUDGET.iterations > MAX_ITERATIONS:
            raise TemplateLimit(f"loops ran more than {MAX_ITERATIONS} iterations")
        if weight:
            _BUDGET.spend_output(weight)
        yield item


def _concat(parts: list[Any]) -> str:
    """The `~` operator, bounded: each part is converted with str() as Jinja does."""
    out: list[str] = []
    total = 0
    for part in parts:
        text = part if isinstance(part, str) else str(part)
        total += len(text)
        _ensure(total, "the '~' result")
        out.append(text)
    return "".join(out)


def _finalize(value: Any) -> Any:
    """Every `{{ ... }}` output, in macros too, is charged to the render's output budget."""
    text = value if isinstance(value, str) else str(value)
    _BUDGET.spend_output(len(text))
    return text


class _Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox plus Kiln's budgets on loops, calls, operators and formats."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        _guard_binop(operator, left, right)
        return _check_value(super().call_binop(context, operator, left, right), f"the result of '{operator}'")

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        """Count calls and their nesting (recursive macros), and guard str methods that grow."""
        _BUDGET.calls += 1
        if _BUDGET.calls > MAX_CALLS:
            raise TemplateLimit(f"more than {MAX_CALLS} calls in one template")
        if _BUDGET.depth >= MAX_CALL_DEPTH:
            raise TemplateLimit(f"calls nested more than {MAX_CALL_DEPTH} deep (a recursive macro?)")
        for value in (*args, *kwargs.values()):
            _check_value(value, "argument")
        owner = getattr(__obj, "__self__", None)
        if isinstance(__obj, types.BuiltinMethodType) and isinstance(owner, str | bytes):
            _guard_str_method(__obj.__name__, owner, args)
        _BUDGET.depth += 1
        try:
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            _BUDGET.depth -= 1
        return _check_value(result, "a call's result")

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        inner = super().wrap_str_format(value)
        if inner is None:
            return None
        fmt = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format(fmt, [*args, *kwargs.values()])
            return inner(*args, **kwargs)

        return checked


def _make_env() -> _Sandbox:
    env = _Sandbox(
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        finalize=_finalize,
        cache_size=0,
    )
    # lipsum, cycler, joiner and namespace are left out: text generators and a mutable
    # object carried across loop iterations are what unbounded growth is made of.
    env.globals = {"range": _range, "dict": dict}
    env.filters = {name: _guard_filter(name, func) for name, func in env.filters.items() if name != "random"}
    env.filters["kiln_each"] = _each
    env.filters["kiln_concat"] = _concat
    return env


_ENV = _make_env()
_MARKERS = ("{{", "{%", "{#")
_COMPILED: dict[tuple[str, str], tuple[jinja2.Template, Any]] = {}
_COMPILED_MAX = 1024


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
        if len(src) > _MAX_SOURCE_LINES_FOR_DIFF or len(out) > _MAX_SOURCE_LINES_FOR_DIFF:
            # A diff of huge files can take quadratic time: fall back to the same line number.
            return [min(j, max(len(src) - 1, 0)) for j in range(len(out))] + [len(src)]
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


class _Bound(NodeTransformer):
    """Routes every loop and every `~` through the budgeted helpers."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        weight = sum(len(data.data) for stmt in node.body for data in stmt.find_all(nodes.TemplateData))
        node.iter = _filter(node.iter, "kiln_each", [nodes.Const(weight)], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _filter(nodes.List(node.nodes, lineno=node.lineno), "kiln_concat", [], node.lineno)


def _filter(node: nodes.Node, name: str, args: list[nodes.Expr], lineno: int) -> nodes.Filter:
    made = nodes.Filter(node, name, args, [], None, None, lineno=lineno)
    made.set_environment(_ENV)
    for child in made.find_all(nodes.Node):
        child.lineno = child.lineno or lineno
    return made


def _unsupported(ast: nodes.Template, file: str) -> list[InputError]:
    """{% include %} and friends would read other files: refused, wherever they appear."""
    found = []
    for node in ast.find_all(tuple(_UNSUPPORTED)):
        keyword = _UNSUPPORTED[type(node)]
        found.append(InputError(f"{{% {keyword} %}} is not supported in Kiln templates", Location(file, node.lineno)))
    return found


def _compile(source: str, file: str) -> tuple[jinja2.Template, Any]:
    """Parse, check and compile a template once per process; raises InputError(s).

    Returns the template and, when it was compiled here rather than loaded from the
    signed disk cache, its code object, for render() to store once it rendered.
    """
    key = (file, source)
    cached = _COMPILED.get(key)
    if cached is not None:
        return cached
    stored = codecache.load(file, source)
    if stored is not None:  # checked and compiled by this same code when it was stored
        template = _ENV.template_class.from_code(_ENV, stored, _ENV.make_globals(None))
        _remember(key, (template, None))
        return template, None
    try:
        ast = _ENV.parse(source, name=file, filename=file)
        unsupported = _unsupported(ast, file)
        if unsupported:
            raise InputErrors(list(unsupported)) if len(unsupported) > 1 else unsupported[0]
        bounded = _Bound().visit(ast)
        code = _ENV.compile(bounded, name=file, filename=file)
        template = _ENV.template_class.from_code(_ENV, code, _ENV.make_globals(None))
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"template syntax: {exc.message}", Location(file, exc.lineno)) from None
    except (RecursionError, MemoryError, SyntaxError, ValueError, OverflowError) as exc:
        # Python's own compiler refuses some shapes Jinja accepts (very deep nesting).
        raise InputError(f"template too complex: {type(exc).__name__}", Location(file, 1)) from None
    _remember(key, (template, code))
    return template, code


def _remember(key: tuple[str, str], entry: tuple[jinja2.Template, Any]) -> None:
    if len(_COMPILED) >= _COMPILED_MAX:
        _COMPILED.clear()
    _COMPILED[key] = entry


def _undefined_names(source: str, file: Path, context: dict[str, Any]) -> list[InputError]:
    """All undefined variables with their lines, not only the first one hit."""
    ast = _ENV.parse(source)
    missing = jinja2.meta.find_undeclared_variables(ast) - context.keys() - _ENV.globals.keys()
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


_SIMPLE = re.compile(r"\{\{[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*\}\}")
_NOT_SIMPLE_NAMES = frozenset(
    {"true", "false", "none", "True", "False", "None", "self", "loop", "caller", "varargs", "kwargs", "range", "dict"}
)


def _render_simple(source: str, context: dict[str, Any]) -> str | None:
    """Templates made only of `{{ name }}` with every name defined render without Jinja.

    The result is what Jinja gives (str() of each value; its newline handling only
    matters with '\\r', which sends the file to Jinja). None when Jinja is needed.
    """
    if "{%" in source or "{#" in source or "\r" in source:
        return None
    pieces: list[str] = []
    total = 0
    last = 0
    for match in _SIMPLE.finditer(source):
        name = match.group(1)
        if name in _NOT_SIMPLE_NAMES or name not in context:
            return None
        value = context[name]
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            return None
        text = str(value)
        pieces.append(source[last : match.start()])
        pieces.append(text)
        total += match.start() - last + len(text)
        if total > MAX_OUTPUT:
            raise TemplateLimit(f"template output is larger than {MAX_OUTPUT} characters")
        last = match.end()
    rest = source[last:]
    if "{{" in rest or any("{{" in piece or piece.endswith("{") for piece in pieces[::2]):
        return None
    pieces.append(rest)
    return "".join(pieces)


def _render_bounded(template: jinja2.Template, context: dict[str, Any]) -> str:
    """Render with fresh budgets, the top-level output counted as it streams."""
    _BUDGET.reset()
    out: list[str] = []
    total = 0
    for chunk in template.generate(context):
        total += len(chunk)
        if total > MAX_OUTPUT:
            raise TemplateLimit(f"template output is larger than {MAX_OUTPUT} characters")
        out.append(chunk)
    return "".join(out)


def render(source: str, file: Path, context: dict[str, Any]) -> Rendered:
    """Render `source`; raise InputError(s) located on template lines, never another exception."""
    if not is_template(source):
        return Rendered(source, source)
    where = str(file)
    try:
        simple = _render_simple(source, context)
    except TemplateLimit as exc:
        raise InputError(f"template error: {exc}", Location(where, 1)) from None
    if simple is not None:
        return Rendered(source, simple)
    template, fresh_code = _compile(source, where)
    try:
        rendered = Rendered(source, _render_bounded(template, context))
    except jinja2.UndefinedError as exc:
        # Only now pay for the full analysis, so every undefined name is reported at once.
        undefined = _undefined_names(source, file, context)
        if undefined:
            raise InputErrors(list(undefined)) from None
        raise InputError(f"undefined: {exc.message}", Location(where, _template_line(exc, where))) from None
    except jinja2.TemplateError as exc:
        raise InputError(f"template error: {exc}", Location(where, _template_line(exc, where))) from None
    except RecursionError as exc:
        raise InputError("template error: nested too deeply", Location(where, _template_line(exc, where))) from None
    except Exception as exc:
        line = _template_line(exc, where)
        raise InputError(f"template error: {type(exc).__name__}: {exc}", Location(where, line)) from None
    if fresh_code is not None:  # only templates that rendered are kept: a failed one writes nothing
        codecache.store(where, source, fresh_code)
        _COMPILED[(where, source)] = (template, None)
    return rendered


def _template_line(exc: BaseException, filename: str = "<template>") -> int:
    """Jinja rewrites tracebacks so template frames carry template lines."""
    line = 0
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename in (filename, "<template>") and frame.lineno:
            line = frame.lineno
    return line or 1


def render_string(template: str, context: dict[str, Any]) -> str:
    """Render a one-off template (for `kiln eval`), in the same sandbox and budgets."""
    compiled, _ = _compile(template, "<template>")
    try:
        return _render_bounded(compiled, context)
    except jinja2.TemplateError as exc:
        raise InputError(f"template error: {exc}") from None
    except Exception as exc:
        raise InputError(f"template error: {type(exc).__name__}: {exc}") from None
