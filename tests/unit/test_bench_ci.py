"""bench/ci.py's reading of a run it did not see end: the stamped log, the lanes, the store's build times."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def bench_ci() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_ci", ROOT / "bench/ci.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_ci"] = module
    spec.loader.exec_module(module)
    return module


LOG = """\
     0.5 ./scripts/setup-host.sh
   160.0 ./scripts/ci-services.sh
   185.0 .venv/bin/python scripts/test_lanes.py .venv/bin/python
   190.0 [boots] prebuild: building in the background (log /tmp/p.log)
  2000.0 [go] lane go: 300 s, exit 0
  2400.0 [builds] ......... [ 50%]
"""


def test_a_stopped_run_is_read_from_its_log(tmp_path: Path) -> None:
    ci = bench_ci()
    log = tmp_path / "ci.log"
    log.write_text(LOG + "a line the run wrote without its newline yet")
    lines, last = ci.read_log(log)
    assert last == 2400.0 and lines[-1][1].endswith("[ 50%]a line the run wrote without its newline yet")
    assert ci.phases(lines, 3000.0) == {"setup": 159.5, "services": 25.0, "tests": 2815.0}
    assert ci.lanes(lines) == {"go": {"s": 300, "exit": 0}}
    result = ci.result_of(lines, 3000.0, None, tmp_path / "no-junit", "a" * 40, "cold", "stopped")
    assert result["exit"] is None and result["total_min"] == 50.0 and result["slowest_tests"] == []
    assert result["prebuilds"] == ["building in the background (log /tmp/p.log)"]


def test_store_builds_take_each_packages_longest_finished_build(tmp_path: Path) -> None:
    ci = bench_ci()
    kernel = tmp_path / "kernel"
    kernel.mkdir()
    (kernel / "a.log").write_text("==> kernel: built in 5132.65 s\n")
    (kernel / "b.log").write_text("==> kernel: step 1 build\n")  # still building: not counted
    (kernel / "last.log").symlink_to("a.log")
    (tmp_path / "go").mkdir()
    (tmp_path / "go" / "c.log").write_text("==> go: built in 747.97 s\n")
    (tmp_path / "go" / "d.log").write_text("==> go: built in 12.5 s\n")
    assert ci.store_builds(tmp_path) == {"go": 747.97, "kernel": 5132.65}
