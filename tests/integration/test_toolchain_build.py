"""The full bootstrapped toolchain (what releases build with), built from the seed.

`kiln build toolchain` compiles binutils, gcc (C, C++) and musl from Debian's source tarballs on
stage0 (12-14 minutes on 2 idle cores, once per machine and again whenever an input of it
changes: it goes to the default store like every other package); the package's own test step
compiles, links statically and runs a C and a C++ program inside the sandbox, so a broken
toolchain fails the build. The exported
/toolchain is then used on the host as a user would: the programs it links are static, carry only
Kiln's compiler ident and run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT
from tests.integration.test_pkgs_userland import PT_INTERP, program_headers

pytestmark = pytest.mark.integration

TRIPLE = "x86_64-kiln-linux-musl"
C_PROGRAM = '#include <stdio.h>\nint main(void) { printf("c %d\\n", 6 * 7); return 0; }\n'
CXX_PROGRAM = (
    "#include <iostream>\n#include <string>\n#include <vector>\n"
    'int main() { std::vector<std::string> v{"c++", "42"}; std::cout << v[0] << " " << v[1] << std::endl; }\n'
)


@pytest.fixture(scope="module")
def toolchain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The exported /toolchain of `kiln build toolchain` (the real pkgs/) in the default store."""
    out = tmp_path_factory.mktemp("toolchain") / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "build", "toolchain", "--json", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    assert json.loads(result.stdout)["packages"]["toolchain"]["status"] in ("built", "cached")
    return out / "toolchain" / "toolchain"


def compile_and_run(compiler: Path, source: str, suffix: str, tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / f"hello{suffix}").write_text(source)
    binary = tmp_path / f"hello{suffix}.bin"
    subprocess.run(
        [str(compiler), "-static", "-O2", str(tmp_path / f"hello{suffix}"), "-o", str(binary)],
        check=True,
        capture_output=True,
        text=True,
    )
    return binary, subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout


@pytest.mark.timeout(3600)
@pytest.mark.parametrize(
    ("driver", "source", "suffix", "expected"),
    [
        ("gcc", C_PROGRAM, ".c", "c 42\n"),
        ("g++", CXX_PROGRAM, ".cc", "c++ 42\n"),
    ],
)
def test_full_toolchain_links_static_programs_that_run(
    toolchain: Path, tmp_path: Path, driver: str, source: str, suffix: str, expected: str
) -> None:
    binary, output = compile_and_run(toolchain / "bin" / f"{TRIPLE}-{driver}", source, suffix, tmp_path)
    assert output == expected
    assert PT_INTERP not in program_headers(binary)  # static: no dynamic loader
    comment = subprocess.run(
        ["readelf", "-p", ".comment", str(binary)], capture_output=True, text=True, check=True
    ).stdout
    assert "GCC: (Kiln) 12.2.0" in comment and "Debian" not in comment  # Kiln's gcc and crt, not stage0's
    assert (toolchain / TRIPLE / "lib" / "libc.a").is_file()  # musl in the toolchain's sysroot
