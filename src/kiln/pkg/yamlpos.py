"""YAML parsing that remembers where every value came from.

PyYAML's node graph knows each value's line; plain `safe_load` forgets it. We
compose nodes (libyaml when available) and build plain Python values plus a
map from value path to line, so validation can name `file:line`.
"""

from __future__ import annotations

from typing import Any

import yaml

try:
    _Loader: type = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - pure-Python fallback
    _Loader = yaml.SafeLoader

Path_ = tuple[str | int, ...]
_STR_TAG = "tag:yaml.org,2002:str"


class DuplicateKey(Exception):
    """A mapping repeats a key; YAML would silently keep the last one."""

    def __init__(self, key: str, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key '{key}' (first at line {first_line})")
        self.line = line


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


def parse(text: str) -> Positioned:
    """Parse one YAML document; raises yaml.YAMLError or DuplicateKey."""
    node = yaml.compose(text, Loader=_Loader)
    lines: dict[Path_, int] = {}
    if node is None:
        return Positioned(None, {(): 1})
    constructor = yaml.SafeLoader("")  # only used for scalar resolution

    def build(n: yaml.Node, path: Path_) -> Any:
        lines[path] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            seen: dict[Any, int] = {}
            for key_node, value_node in n.value:
                key = constructor.construct_object(key_node, deep=True)
                if isinstance(key, list | dict):
                    key = str(key)
                if key in seen:
                    raise DuplicateKey(str(key), key_node.start_mark.line + 1, seen[key])
                seen[key] = key_node.start_mark.line + 1
                child = (*path, key if isinstance(key, str) else str(key))
                out[key] = build(value_node, child)
                lines[child] = key_node.start_mark.line + 1
            return out
        if isinstance(n, yaml.SequenceNode):
            return [build(item, (*path, i)) for i, item in enumerate(n.value)]
        if n.tag == _STR_TAG:
            return n.value
        return constructor.construct_object(n, deep=True)

    value = build(node, ())
    return Positioned(value, lines)
