"""Cross builds: build and target platforms are distinct in the variables, the seed and the keys."""

from __future__ import annotations

from pathlib import Path
from typing import IO

import pytest

from kiln.build.builder import Builder, log_path
from kiln.build.cache_keys import compute_keys, stage0_key
from kiln.build.emulation import cannot_run_reason
from kiln.build.rootplan import RootPlan
from kiln.build.runners.base import Caches
from kiln.build.sources.download import Fetcher
from kiln.build.store import Store
from kiln.core.errors import BuildError, InputErrors
from kiln.pkg.graph import Graph
from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform, builtins
from tests.conftest import write_tree

AMD64 = Platform.parse("linux/amd64")
ARM64 = Platform.parse("linux/arm64")
REPO_PKGS = Path(__file__).resolve().parents[2] / "pkgs"

TREE = {
    "stage0.yaml": "suite: bookworm\ninclude: [gcc]\ncross:\n  arm64: [gcc-aarch64-linux-gnu]\n",
    "toolchain/pkg.yaml": "name: toolchain\nvariant: stage0\nfinalize: [{from: /toolchain, to: /toolchain}]\n",
    "app/pkg.yaml": """
        name: app
        steps:
          - build: ['echo {{ arch }} {{ build_arch }} {{ cross }}']
        finalize: [{from: /out, to: /}]
        """,
}


def test_builtins_name_both_platforms() -> None:
    native = builtins(AMD64, AMD64)
    cross = builtins(ARM64, AMD64)
    assert (native["arch"], native["build_arch"], native["cross"]) == ("amd64", "amd64", False)
    assert (cross["arch"], cross["carch"], cross["target"]) == ("arm64", "aarch64", "aarch64-kiln-linux-musl")
    assert (cross["build_arch"], cross["build_carch"], cross["cross"]) == ("amd64", "x86_64", True)


def test_a_native_key_does_not_name_a_build_platform(tmp_path: Path) -> None:
    """Native keys stay what they were before cross builds: the build platform IS the target."""
    pkgs = write_tree(tmp_path, TREE)
    native = load_tree(pkgs, AMD64, build=AMD64)
    assert not native.cross
    assert native.stage0.identity() == {
        "suite": "bookworm",
        "mirror": "http://deb.debian.org/debian",
        "variant": "minbase",
        "include": ["gcc"],
    }


def test_cross_keys_differ_from_native_and_from_other_build_machines(tmp_path: Path) -> None:
    pkgs = write_tree(tmp_path, TREE)
    amd_on_amd = load_tree(pkgs, AMD64, build=AMD64)
    arm_on_amd = load_tree(pkgs, ARM64, build=AMD64)
    arm_on_arm = load_tree(pkgs, ARM64, build=ARM64)
    seeds = {stage0_key(t) for t in (amd_on_amd, arm_on_amd, arm_on_arm)}
    assert len(seeds) == 3
    keys = [compute_keys(Graph(t))["app"] for t in (amd_on_amd, arm_on_amd, arm_on_arm)]
    assert len(set(keys)) == 3
    # one key for an amd64-built arm64 package, however often it is computed
    assert compute_keys(Graph(load_tree(pkgs, ARM64, build=AMD64)))["app"] == keys[1]
    assert arm_on_amd.packages["app"].steps[0].build == ("echo arm64 amd64 True",)


def test_a_cross_seed_adds_the_cross_compilers(tmp_path: Path) -> None:
    pkgs = write_tree(tmp_path, TREE)
    tree = load_tree(pkgs, ARM64, build=AMD64)
    assert tree.stage0.packages("arm64") == ("gcc", "gcc-aarch64-linux-gnu")
    assert tree.stage0.packages(None) == ("gcc",)
    assert tree.stage0.packages("amd64") == ("gcc",)


def test_cross_lists_name_an_architecture(tmp_path: Path) -> None:
    pkgs = write_tree(
        tmp_path, {**TREE, "stage0.yaml": "suite: bookworm\ncross:\n  riscv64: [gcc-riscv64-linux-gnu]\n"}
    )
    with pytest.raises(InputErrors) as caught:
        load_tree(pkgs, AMD64)
    assert "stage0.yaml:" in str(caught.value)
    assert "riscv64" in str(caught.value)


@pytest.mark.parametrize("target", ["linux/amd64", "linux/arm64"])
def test_the_shipped_tree_renders_for_both_targets(target: str) -> None:
    tree = load_tree(REPO_PKGS, Platform.parse(target), build=AMD64)
    seed = tree.packages["toolchain-seed"].steps[0]
    script = "\n".join(seed.build + seed.install)
    if target == "linux/arm64":
        assert "CROSS_COMPILE=aarch64-linux-gnu- ./configure --target=aarch64" in script
        assert "/usr/bin/aarch64-linux-gnu-$tool" in script
        assert tree.stage0.packages("arm64")[-2:] == ("gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross")
    else:
        assert "CROSS_COMPILE" not in script
    # Go runs on the build machine; machined is compiled for the target
    go = tree.packages["go-bootstrap-1.25"].steps[0].sources[0].url or ""
    assert go.endswith("_amd64.deb")
    assert dict(tree.packages["machined"].steps[0].env)["GOARCH"] == Platform.parse(target).arch


def test_emulation_reason_reads_the_binfmt_entry(tmp_path: Path) -> None:
    assert "qemu-user-static" in (cannot_run_reason("aarch64", tmp_path) or "")
    entry = tmp_path / "qemu-aarch64"
    entry.write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PO\n")
    assert "F flag" in (cannot_run_reason("aarch64", tmp_path) or "")
    entry.write_text("disabled\nflags: POF\n")
    assert "disabled" in (cannot_run_reason("aarch64", tmp_path) or "")
    entry.write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POF\n")
    assert cannot_run_reason("aarch64", tmp_path) is None


def test_a_package_that_cannot_be_cross_built_says_so_at_validate_time(tmp_path: Path) -> None:
    pkgs = write_tree(
        tmp_path,
        {
            **TREE,
            "native/pkg.yaml": "name: native\n# runs what it builds\ncross: false\nsteps: [{build: [make]}]\n"
            "finalize: [{from: /out, to: /}]\n",
        },
    )
    assert "native" in load_tree(pkgs, AMD64, build=AMD64).packages
    with pytest.raises(InputErrors) as caught:
        load_tree(pkgs, ARM64, build=AMD64)
    assert f"{pkgs / 'native' / 'pkg.yaml'}:3: package 'native' cannot be cross-built" in str(caught.value)


TOOL_TREE = {
    **TREE,
    "compiler/pkg.yaml": """
        name: compiler
        tool: true
        steps:
          - build: ['echo {{ arch }}']
        finalize: [{from: /out, to: /}]
        """,
    "app/pkg.yaml": """
        name: app
        dependencies:
          - stage: compiler
        steps:
          - build: ['echo {{ arch }}']
        finalize: [{from: /out, to: /}]
        """,
}


def test_a_cross_build_takes_its_tools_native_keys(tmp_path: Path) -> None:
    """A tool runs on the build machine: arm64 built on amd64 shares amd64's build of it."""
    pkgs = write_tree(tmp_path, TOOL_TREE)
    native = compute_keys(Graph(load_tree(pkgs, AMD64, build=AMD64)))
    cross_tree = load_tree(pkgs, ARM64, build=AMD64)
    cross = compute_keys(Graph(cross_tree))
    assert cross_tree.native is not None and cross_tree.native.platform == AMD64
    assert cross_tree.native_tool("compiler") and not cross_tree.native_tool("app")
    assert cross["compiler"] == native["compiler"]
    assert cross["app"] != native["app"]
    # and the tool's key still reaches its dependents: a changed tool rebuilds the arm64 app
    changed = TOOL_TREE["compiler/pkg.yaml"].replace("echo {{ arch }}", "echo v2 {{ arch }}")
    pkgs2 = write_tree(tmp_path / "b", {**TOOL_TREE, "compiler/pkg.yaml": changed})
    changed_keys = compute_keys(Graph(load_tree(pkgs2, ARM64, build=AMD64)))
    assert changed_keys["compiler"] != cross["compiler"]
    assert changed_keys["app"] != cross["app"]


def test_a_native_tree_loads_no_second_tree(tmp_path: Path) -> None:
    pkgs = write_tree(tmp_path, TOOL_TREE)
    tree = load_tree(pkgs, AMD64, build=AMD64)
    assert tree.native is None and not tree.native_tool("compiler")


def test_the_shipped_go_chain_is_shared_between_targets() -> None:
    native = compute_keys(Graph(load_tree(REPO_PKGS, AMD64, build=AMD64)))
    cross = compute_keys(Graph(load_tree(REPO_PKGS, ARM64, build=AMD64)))
    for name in ("go-bootstrap-1.25", "go"):
        assert cross[name] == native[name], name
    assert cross["machined"] != native["machined"]


class RecordingRoot:
    """A build root that records the snippets it is asked to run (they all succeed)."""

    def __init__(self, work: Path, ran: list[str]) -> None:
        self.work, self.ran = work, ran

    @property
    def build_dir(self) -> Path:
        path = self.work / "build"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def run(self, script: str, env: dict[str, str], log: IO[bytes], *, network: bool, caches: Caches = ()) -> int:
        self.ran.append(script)
        return 0

    def finalize(self, copies: list[tuple[str, str]], out: Path, log: IO[bytes]) -> int:
        (out / "file").write_text("done")
        return 0

    def shell(self, env: dict[str, str], command: list[str]) -> int:
        return 0

    def close(self) -> None:
        pass


class RecordingRunner:
    name = "recording"

    def __init__(self) -> None:
        self.ran: list[str] = []

    def open(self, plan: RootPlan, work: Path) -> RecordingRoot:
        return RecordingRoot(work, self.ran)


CROSS_APP = {
    "stage0.yaml": "suite: bookworm\n",
    "app/pkg.yaml": """
        name: app
        variant: scratch
        steps:
          - build: [make]
            test: [./app --selftest]
        finalize: [{from: /out, to: /}]
        """,
}


def cross_builder(tmp_path: Path, runner: RecordingRunner) -> Builder:
    graph = Graph(load_tree(write_tree(tmp_path, CROSS_APP), ARM64, build=AMD64))
    store = Store(tmp_path / "cache")
    return Builder(graph, compute_keys(graph), store, Fetcher(store.root, []), runner, 1, 0)


@pytest.mark.parametrize("reason", [None, "no binfmt handler for aarch64 programs"])
def test_a_cross_builds_test_steps_run_or_are_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reason: str | None
) -> None:
    """Stubbed: whether this host can run aarch64 programs (the binfmt reader is tested above),
    and the runner (it records snippets instead of running them); the builder's choice is real."""
    monkeypatch.setattr("kiln.build.builder.cannot_run_reason", lambda carch: reason)
    runner = RecordingRunner()
    builder = cross_builder(tmp_path, runner)
    builder.build("app", lambda text: None)
    log = log_path(builder.store, "app", builder.keys["app"]).read_text()
    if reason is None:
        assert runner.ran == ["make", "./app --selftest"]
        assert "SKIPPED" not in log
    else:
        assert runner.ran == ["make"]
        assert f"step 1 test SKIPPED: cannot run linux/arm64 programs: {reason}" in log


def test_a_cross_builder_never_builds_a_tool_with_the_cross_seed(tmp_path: Path) -> None:
    graph = Graph(load_tree(write_tree(tmp_path, TOOL_TREE), ARM64, build=AMD64))
    store = Store(tmp_path / "cache")
    builder = Builder(graph, compute_keys(graph), store, Fetcher(store.root, []), RecordingRunner(), 1, 0)
    with pytest.raises(BuildError, match="'compiler' is a tool"):
        builder.build("compiler", lambda text: None)
