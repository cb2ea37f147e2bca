"""The package DAG for one platform: order, closures, runtime dependencies, cycles."""

from __future__ import annotations

import graphlib
from collections.abc import Iterable

from kiln.core.errors import InputError, InputErrors, KilnError, Location
from kiln.core.schema import suggest
from kiln.pkg.loader import Tree
from kiln.pkg.model import Dependency


class Graph:
    """Edges point from a package to what it needs to build.

    A `variant: toolchain` package also needs the toolchain package: that edge
    is implicit in the spec but real in the graph, keys and build order.
    """

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        self.edges: dict[str, list[str]] = {}
        for name, package in tree.packages.items():
            needs = [d.stage for d in package.dependencies]
            if package.variant == "toolchain" and tree.toolchain in tree.packages:
                needs.append(tree.toolchain)
            self.edges[name] = list(dict.fromkeys(needs))
        errors = self._cycle_errors()
        if errors:
            raise InputErrors(errors)
        self.order = self._topological_order()
        self._runtime: dict[str, list[Dependency]] = {}

    def _sorter(self, edges: dict[str, list[str]]) -> graphlib.TopologicalSorter[str]:
        sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
        for name in sorted(edges):
            sorter.add(name, *edges[name])
        return sorter

    def _topological_order(self) -> list[str]:
        return list(self._sorter(self.edges).static_order())

    def _cycle_errors(self) -> list[KilnError]:
        """Every independent cycle, each reported once at the edge that closes it."""
        edges = {k: list(v) for k, v in self.edges.items()}
        errors: list[KilnError] = []
        for _ in range(len(edges) + 1):
            try:
                self._sorter(edges).prepare()
                return errors
            except graphlib.CycleError as exc:
                cycle: list[str] = list(reversed(exc.args[1]))
            # cycle reads a -> b -> ... -> a; a needs b
            start = min(range(len(cycle) - 1), key=lambda i: cycle[i])
            path = cycle[start:-1] + cycle[:start] + [cycle[start]]
            needer, needed = path[0], path[1]
            package = self.tree.packages[needer]
            line = 1
            for index, dep in enumerate(package.dependencies):
                if dep.stage == needed:
                    line = package.line(("dependencies", index, "stage"))
            errors.append(InputError(f"dependency cycle: {' -> '.join(path)}", Location(str(package.file), line)))
            edges[needer].remove(needed)
        return errors

    def closure(self, targets: Iterable[str]) -> list[str]:
        """Targets and everything they need, in build order."""
        wanted: set[str] = set()
        stack = list(targets)
        for name in stack:
            if name not in self.edges:
                raise InputError(f"unknown package '{name}'{suggest(name, set(self.edges))}")
        while stack:
            name = stack.pop()
            if name not in wanted:
                wanted.add(name)
                stack.extend(self.edges[name])
        return [n for n in self.order if n in wanted]

    def selected(self, targets: list[str]) -> list[str]:
        """What a verb's optional TARGET... names: their closure, or every package when none is named."""
        return self.closure(targets) if targets else self.order

    def dependents(self, name: str) -> list[str]:
        """Packages whose keys change when `name`'s does."""
        reverse: dict[str, set[str]] = {n: set() for n in self.edges}
        for src, needs in self.edges.items():
            for n in needs:
                reverse[n].add(src)
        out: set[str] = set()
        stack = [name]
        while stack:
            for parent in reverse[stack.pop()]:
                if parent not in out:
                    out.add(parent)
                    stack.append(parent)
        return [n for n in self.order if n in out]

    def runtime_deps(self, name: str) -> list[Dependency]:
        """Dependencies marked runtime, followed transitively: handed to whoever needs `name`."""
        if name not in self._runtime:
            found: dict[str, Dependency] = {}
            for dep in self.tree.packages[name].dependencies:
                if dep.runtime:
                    found.setdefault(dep.stage, dep)
                    for inner in self.runtime_deps(dep.stage):
                        found.setdefault(inner.stage, inner)
            self._runtime[name] = list(found.values())
        return self._runtime[name]

    def build_inputs(self, name: str) -> list[Dependency]:
        """What goes into `name`'s build root: its dependencies and their runtime closures."""
        found: dict[str, Dependency] = {}
        for dep in self.tree.packages[name].dependencies:
            found.setdefault(dep.stage, dep)
            for inner in self.runtime_deps(dep.stage):
                found.setdefault(inner.stage, inner)
        return list(found.values())
