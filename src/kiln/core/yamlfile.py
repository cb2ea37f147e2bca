"""YAML parsing that remembers where every value came from, hardened for hostile files.

PyYAML's node graph knows each value's line; plain `safe_load` forgets it. We walk
the parser's event stream (libyaml when available) and build plain Python values
plus a map from value path to line, so validation can name `file:line`.

Every file Kiln reads as YAML (pkg.yaml, vars.yaml, stage0.yaml, profiles, kiln-project.yaml)
is written by someone else and read as root, so the walk is bounded: no aliases or
anchors (an alias bomb grows memory without bound and the files never need them),
nesting at most MAX_DEPTH deep (checked while events arrive, before the parser's own
quadratic cost at thousands of levels), files at most MAX_BYTES, UTF-8 only, and only
regular files are opened (a FIFO would block the read forever).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from kiln.core.errors import InputError, Location

try:
    _Loader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - pure-Python fallback
    _Loader = yaml.SafeLoader

Path_ = tuple[str | int, ...]
_STR_TAG = "tag:yaml.org,2002:str"
MAX_DEPTH = 64
MAX_BYTES = 1 << 20


class YamlProblem(Exception):
    """Valid YAML syntax Kiln still refuses; `line` is 1-based."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class DuplicateKey(YamlProblem):
    """A mapping repeats a key; YAML would silently keep the last one."""

    def __init__(self, key: str, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key '{key}' (first at line {first_line})", line)


class Positioned:
    """Plain values plus the 1-based line of each path inside them."""

    def __init__(self, value: Any, lines: dict[Path_, int]) -> None:
        self.value = value
        self.lines = lines

    def line(self, path: Path_) -> int:
        """Line of `path`, or of its nearest ancestor that has one."""
        probe = tuple(path)
        while probe:
            if probe in self.lines:
                return self.lines[probe]
            probe = probe[:-1]
        return self.lines.get((), 1)


class _Builder:
    """Turns one document's events into values and lines, refusing what could blow up."""

    def __init__(self) -> None:
        self.lines: dict[Path_, int] = {}
        self.resolver = yaml.resolver.Resolver()
        self.constructor = yaml.constructor.SafeConstructor()

    def scalar(self, event: Any) -> Any:
        """Resolve a scalar the way SafeLoader would; bad literals become YamlProblem."""
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolver.resolve(yaml.ScalarNode, event.value, event.implicit)  # type: ignore[no-untyped-call]
        if tag == _STR_TAG:
            return event.value
        node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError:
            raise
        except Exception as exc:
            # SafeConstructor lets plain exceptions out for literals like 2024-13-45, a
            # 5000-digit int or an empty `!!int` (IndexError): all of them are bad input.
            raise YamlProblem(f"bad value {event.value[:40]!r}: {exc}", _line(event)) from None


def _line(event: Any) -> int:
    """1-based line where an event starts."""
    return int(event.start_mark.line) + 1 if event.start_mark is not None else 1


def _refuse_anchor(event: Any) -> None:
    """Anchors and aliases are refused outright: cheap to check, and none of our files need them."""
    if isinstance(event, yaml.AliasEvent):
        raise YamlProblem(f"YAML aliases (*{event.anchor}) are not allowed in Kiln files", _line(event))
    anchor = getattr(event, "anchor", None)
    if anchor is not None:
        raise YamlProblem(f"YAML anchors (&{anchor}) are not allowed in Kiln files", _line(event))


def _hashable_key(key: Any) -> Any:
    """Mapping keys that are collections are kept as their text, as before."""
    return str(key) if isinstance(key, list | dict) else key


_NO_KEY = object()
_KEY_MARK = "\0key"
_SCALAR, _ALIAS = yaml.ScalarEvent, yaml.AliasEvent
_SEQ_START, _MAP_START = yaml.SequenceStartEvent, yaml.MappingStartEvent
_SEQ_END, _MAP_END, _DOC_END = yaml.SequenceEndEvent, yaml.MappingEndEvent, yaml.DocumentEndEvent
_IMPLICIT = yaml.resolver.Resolver.yaml_implicit_resolvers


def _walk(next_event: Any, builder: _Builder) -> Any:  # noqa: C901 - flat on purpose: the hot loop of loading a tree
    """Build the first document's value from events, without recursion, depth-capped.

    One loop with the event class compared by identity: this walk is most of the cost
    of loading a tree, so it stays flat.
    """
    # Each frame: [container, path, pending key or _NO_KEY, key line, seen keys, under a key]
    stack: list[list[Any]] = []
    lines = builder.lines
    root: Any = None
    while True:
        event = next_event()
        if event is None:
            break
        kind = event.__class__
        if kind is _SCALAR:
            if event.anchor is not None:
                _refuse_anchor(event)
            value = _scalar(event, builder)
        elif kind is _SEQ_START or kind is _MAP_START:
            if event.anchor is not None:
                _refuse_anchor(event)
            line = event.start_mark.line + 1
            if len(stack) >= MAX_DEPTH:
                raise YamlProblem(f"nested more than {MAX_DEPTH} levels deep", line)
            path = _record(stack, line, lines)
            stack.append([[] if kind is _SEQ_START else {}, path, _NO_KEY, 0, {}])
            continue
        elif kind is _SEQ_END or kind is _MAP_END:
            value = stack.pop()[0]
        elif kind is _ALIAS:
            _refuse_anchor(event)
        elif kind is _DOC_END:
            _single_document(next_event())
            break
        else:  # stream and document starts
            continue
        if not stack:
            if kind is _SCALAR:
                lines[()] = event.start_mark.line + 1
            root = value
            continue
        frame = stack[-1]
        container = frame[0]
        if container.__class__ is list:
            if kind is _SCALAR and _KEY_MARK not in frame[1]:
                lines[(*frame[1], len(container))] = event.start_mark.line + 1
            container.append(value)
        elif frame[2] is _NO_KEY:
            _take_key(frame, value, event.start_mark.line + 1)
        else:
            if kind is _SCALAR and _KEY_MARK not in frame[1]:
                key = frame[2]
                lines[(*frame[1], key if key.__class__ is str else str(key))] = frame[3]
            container[frame[2]] = value
            frame[2] = _NO_KEY
    return root


def _single_document(event: Any) -> None:
    """As yaml.compose: a second document in the stream is an error, not silently dropped."""
    if isinstance(event, yaml.DocumentStartEvent):
        raise YamlProblem("expected a single YAML document, found another", _line(event))


def _scalar(event: Any, builder: _Builder) -> Any:
    """Plain text stays text without the resolver unless its first character could start another type."""
    if event.tag is None and (not event.implicit[0] or event.value[:1] not in _IMPLICIT):
        return event.value
    return builder.scalar(event)


def _record(stack: list[list[Any]], line: int, lines: dict[Path_, int]) -> Path_:
    """Path of a collection about to be added to the innermost container, its line recorded.

    A mapping value's line is its key's line, as users point at `key: value`; values
    inside a mapping key (rare) get no lines.
    """
    if not stack:
        lines[()] = line
        return ()
    container, path, key = stack[-1][0], stack[-1][1], stack[-1][2]
    if isinstance(container, list):
        child: Path_ = (*path, len(container))
    elif key is _NO_KEY:
        return (*path, _KEY_MARK)
    else:
        child = (*path, key if isinstance(key, str) else str(key))
        line = stack[-1][3]
    if _KEY_MARK not in path:
        lines[child] = line
    return child


def _take_key(frame: list[Any], value: Any, line: int) -> None:
    """A finished mapping key: refused if repeated, else waiting for its value."""
    key = _hashable_key(value)
    seen: dict[Any, int] = frame[4]
    try:
        first = seen.get(key)
    except TypeError:  # an unhashable scalar key (a set-like value): keep its text
        key = str(key)
        first = seen.get(key)
    if first is not None:
        raise DuplicateKey(str(key), line, first)
    seen[key] = line
    frame[2], frame[3] = key, line


def parse(text: str) -> Positioned:
    """Parse one YAML document; raises yaml.YAMLError or YamlProblem (DuplicateKey among them)."""
    builder = _Builder()
    loader = _Loader(text)
    try:
        value = _walk(loader.get_event, builder)
    except yaml.MarkedYAMLError as error:
        # libyaml 0.2.6 (PyYAML 6.0.4 wheels) caps flow nesting itself, while scanning
        # ahead of the events that would reach the cap above: the same refusal either way.
        if error.problem != "exceeded maximum nesting depth":
            raise
        line = error.problem_mark.line + 1 if error.problem_mark else 1
        raise YamlProblem(f"nested more than {MAX_DEPTH} levels deep", line) from None
    finally:
        loader.dispose()
    if value is None:
        return Positioned(None, {(): 1})
    return Positioned(value, builder.lines)


def read_text_file(path: Path, max_bytes: int = MAX_BYTES, what: str = "file", within: Path | None = None) -> str:
    """A regular file's UTF-8 text, at most `max_bytes`; anything else is an InputError at file:line.

    Opened with O_NONBLOCK and checked with fstat before reading, so a FIFO, socket or
    device named like a Kiln file is refused instead of hanging or streaming forever.
    With `within`, a file that resolves (through links) outside that directory is
    refused: a tree's pkg.yaml linked to /etc/shadow would otherwise be quoted in errors.
    """
    where = str(path)
    if within is not None and _is_link(path):  # the tree's own directories are walked without following links
        real = Path(os.path.realpath(path))
        base = Path(os.path.realpath(within))
        if base != real and base not in real.parents:
            raise InputError(f"{what} links to a file outside the package tree", Location(where, 1))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", Location(where, 1)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{what} is not a regular file", Location(where, 1))
        if info.st_size > max_bytes:
            raise InputError(f"{what} is too large ({info.st_size} bytes; at most {max_bytes})", Location(where, 1))
        data = _read_at_most(fd, max_bytes + 1, info.st_size)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", Location(where, 1)) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise InputError(f"{what} is too large (more than {max_bytes} bytes)", Location(where, 1))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{what} is not valid UTF-8 (byte {exc.start})", Location(where, line)) from None


def _is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_at_most(fd: int, limit: int, expected: int) -> bytes:
    """Read until EOF or `limit` bytes; a regular file's short read is its end, so one call usually does."""
    chunks: list[bytes] = []
    size = 0
    want = min(expected + 1, limit)
    while size < limit:
        chunk = os.read(fd, want)
        chunks.append(chunk)
        size += len(chunk)
        if len(chunk) < want:
            break
        want = min(1 << 16, limit - size)
    return b"".join(chunks)


def yaml_input_error(exc: Exception, where: str, line_of: Any = None, text: str = "") -> InputError:
    """The InputError for a YAML or YamlProblem failure; `line_of` maps parsed lines (templates)."""

    def mapped(line: int) -> int:
        return int(line_of(line)) if line_of and line else line

    if isinstance(exc, YamlProblem):
        return InputError(exc.message, Location(where, mapped(exc.line)))
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or str(exc)
        return InputError(f"YAML syntax: {problem}", Location(where, mapped(mark.line + 1) if mark else 1))
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        return InputError(f"YAML syntax: {exc.reason}", Location(where, mapped(line)))
    return InputError(f"YAML syntax: {exc}", Location(where, 1))


def parse_text(text: str, where: str, line_of: Any = None) -> Positioned:
    """parse() with every failure turned into an InputError at file:line."""
    try:
        return parse(text)
    except (yaml.YAMLError, YamlProblem) as exc:
        raise yaml_input_error(exc, where, line_of, text) from None
    except RecursionError:  # pragma: no cover - the depth cap comes first
        raise InputError(f"nested more than {MAX_DEPTH} levels deep", Location(where, 1)) from None


def read_yaml_file(
    path: Path, max_bytes: int = MAX_BYTES, what: str = "file", within: Path | None = None
) -> Positioned:
    """The one way Kiln reads a YAML file: type check, size cap, UTF-8, no aliases, depth cap.

    Raises InputError located at file:line for every problem, never another exception.
    """
    return parse_text(read_text_file(path, max_bytes, what, within), str(path))
