"""Every host-side caller kiln.core.nofollow names goes through it: an AST check of each listed function and
the module-local helpers it calls, which must reach the helper and make no raw open, read, write, chmod,
utime, rename, walk, listing, stat or copy call on a path (those follow a tree's links with the host's view).
The behaviour behind each is tested with planted links in test_nofollow.py, test_module_signing.py,
test_hostile_layers.py and tests/integration/test_hostile_assembly.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kiln.core import nofollow

SRC = Path(__file__).resolve().parents[2] / "src"

# module -> the functions (and ModuleSigner methods) that work on trees others wrote
CALLERS = {
    "kiln.signing.modules": ["sign_tree"],
    "kiln.rootfs.extension": [
        "check_paths",
        "layer_tree",
        "has_modules",
        "modules_layer",
        "kernel_release",
        "module_files",
        "vermagic",
        "_check_named_modules",
    ],
    "kiln.rootfs.tree": ["merge", "prune", "check_minimal", "strip_binaries", "largest_files", "clamp_times"],
    "kiln.rootfs.assemble": ["kernel_parts", "copy_vmlinuz", "_copy_init"],
    "kiln.image.imager": ["package_file"],
    "kiln.image.arch": ["loader_for"],
    "kiln.build.check": ["_kept_copies"],
    "kiln.signing.rebuild.compare": ["disk_digest", "_copy_release_file", "_regular"],
    "kiln.signing.rebuild.checkout": ["_sha256_in", "kiln_of"],
}

# attribute calls that act on a path with the host's view (follow links): `x.write_text(...)`, `os.walk(...)`
RAW_METHODS = {
    "open", "read_bytes", "read_text", "write_bytes", "write_text", "chmod", "lchmod", "touch", "rename",
    "symlink_to", "hardlink_to", "iterdir", "glob", "rglob", "walk", "is_file", "is_dir", "exists", "is_symlink",
    "stat", "lstat", "samefile", "resolve", "readlink", "unlink", "rmdir",
}  # fmt: skip
RAW_MODULE_CALLS = {
    ("os", name)
    for name in ("open", "chmod", "chown", "lchown", "utime", "rename", "replace", "walk", "listdir", "scandir",
                 "stat", "lstat", "unlink", "remove", "link", "symlink", "readlink", "fwalk")
} | {
    ("shutil", name) for name in ("copy", "copy2", "copyfile", "copytree", "copystat", "copymode", "move")
} | {("os.path", name) for name in ("exists", "isfile", "isdir", "islink", "getsize", "realpath")}  # fmt: skip
ALLOWED_RAW = {("os.path", "lexists")}  # on a path join_inside resolved inside the tree, the last link kept


def functions(module: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse((SRC / (module.replace(".", "/") + ".py")).read_text())
    found: dict[str, ast.FunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            found.setdefault(node.name, node)
    return found


def dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return "?"


def reached(module: str, name: str) -> list[ast.FunctionDef]:
    """`name` and every function of the same module it calls, transitively (self.x() included)."""
    defs = functions(module)
    seen: dict[str, ast.FunctionDef] = {}
    pending = [name]
    while pending:
        current = pending.pop()
        if current in seen or current not in defs:
            continue
        seen[current] = defs[current]
        for call in (n for n in ast.walk(defs[current]) if isinstance(n, ast.Call)):
            func = call.func
            if isinstance(func, ast.Name):
                pending.append(func.id)
            elif isinstance(func, ast.Attribute) and dotted(func.value) == "self":
                pending.append(func.attr)
    return list(seen.values())


def raw_calls(function: ast.FunctionDef) -> list[str]:
    found = []
    for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
        func = call.func
        if isinstance(func, ast.Name) and func.id == "open":
            found.append(f"open() at line {call.lineno}")
        if not isinstance(func, ast.Attribute):
            continue
        owner = dotted(func.value)
        if (owner, func.attr) in ALLOWED_RAW or owner == "nofollow" or owner.startswith("nofollow."):
            continue
        path_method = owner not in ("os", "os.path", "shutil", "tools", "self") and func.attr in RAW_METHODS
        if (owner, func.attr) in RAW_MODULE_CALLS or path_method:
            found.append(f"{owner}.{func.attr}() at line {call.lineno}")
    return found


CASES = [(module, name) for module, names in CALLERS.items() for name in names]


@pytest.mark.parametrize(("module", "name"), CASES, ids=[f"{m}.{n}" for m, n in CASES])
def test_a_tree_caller_makes_no_raw_call_and_goes_through_the_helper(module: str, name: str) -> None:
    bodies = reached(module, name)
    assert bodies, f"{module}.{name} is gone: update CALLERS and kiln.core.nofollow's list"
    raw = [f"{f.name}: {call}" for f in bodies for call in raw_calls(f)]
    assert not raw, f"{module}.{name} touches a tree with the host's view: {raw}"
    text = "\n".join(ast.unparse(f) for f in bodies)
    assert "nofollow." in text or "join_inside(" in text, f"{module}.{name} never reaches kiln.core.nofollow"


def test_the_helper_names_every_caller_this_test_checks() -> None:
    doc = nofollow.__doc__ or ""
    for module, names in CALLERS.items():
        assert module in doc, f"kiln.core.nofollow's docstring does not list {module}"
        for name in names:
            assert name.startswith("_") or name in doc, f"{module}.{name} is not in the docstring"


def test_the_check_catches_a_raw_call() -> None:
    """The AST check itself: a function writing through a path is caught."""
    source = "def f(p):\n    (p / 'x').write_text('y')\n    os.utime(p)\n    shutil.copy2(p, p)\n    open(p)\n"
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    assert len(raw_calls(function)) == 4
