"""`kiln init --extension NAME DIR`: a new extension project, ready to build on the stock tree.

The project holds kiln-project.yaml (its package trees: the stock one, then its own), one
package under pkgs/NAME and a README with the loop (`kiln extension build NAME`, `kiln dev boot
--extension NAME`). Two kinds: `service` (a static C program machined supervises) and `module`
(an out-of-tree kernel module built against kernel-build, loaded at boot). What it writes is a
starting point an author edits, so it is plain text with comments, never generated again.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from kiln.core.errors import InputError

KINDS = ("service", "module")
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")

PROJECT = """\
# An extension project: the stock package tree first, then this project's own (kiln --pkgs, repeated).
pkgs: [{stock}, pkgs]
"""

SERVICE_PKG = """\
# {name}: a service machined supervises (its definition: /usr/local/lib/kiln/services/{name}.json).
# Static against musl, like the rootfs's own programs: a Kiln root has no shared libc to link to.
name: {name}
variant: toolchain
version: "0.1.0"
description: {name}, a supervised service
extension:
  author: {author}
  compatibility: ">={kiln_minor},<{kiln_next}"
steps:
  - sources:
      - path: pkgs/{name}/{name}.c
        destination: {name}.c
      - path: pkgs/{name}/{name}.json
        destination: {name}.json
    env:
      CC: "{{{{ target }}}}-gcc -static"
    build:
      - $CC -Os -Wall -Wextra -Werror -o {name} {name}.c
    install:
      - mkdir -p /out/usr/local/bin /out/usr/local/lib/kiln/services
      - cp {name} /out/usr/local/bin/ && {{{{ target }}}}-strip /out/usr/local/bin/{name}
      - cp {name}.json /out/usr/local/lib/kiln/services/
    test:
      - file /out/usr/local/bin/{name} | grep -q 'statically linked'
finalize:
  - from: /out
    to: /
"""

SERVICE_C = """\
/* {name}: says it runs, then waits; machined restarts it if it exits. Replace with your service. */
#include <stdio.h>
#include <unistd.h>

int main(void) {{
    printf("{name}: running\\n");
    fflush(stdout);
    for (;;)
        pause();
}}
"""

SERVICE_JSON = """\
{{"command": "/usr/local/bin/{name}", "restart": "always"}}
"""

MODULE_PKG = """\
# {name}: an out-of-tree kernel module, built against the stock tree's kernel-build so it carries
# that kernel's vermagic and symbol CRCs (kiln image refuses it otherwise); machined loads it at boot.
{{% set karch = {{"amd64": "x86", "arm64": "arm64"}}[arch] %}}
{{% set cross_compile = target ~ "-" if toolchain == "toolchain" else (carch ~ "-linux-gnu-" if cross else "") %}}
name: {name}
variant: toolchain
version: "0.1.0"
description: {name}, a kernel module loaded at boot
license: GPL-2.0-only
extension:
  author: {author}
  compatibility: ">={kiln_minor},<{kiln_next}"
{kernel_range}  modules: [{module}]
dependencies:
  - stage: kernel-build
    from: /usr/src/linux-build
    to: /usr/src/linux-build
steps:
  - sources:
      - path: pkgs/{name}/src
        destination: src
    env:
      ARCH: "{{{{ karch }}}}"
      {{% if cross_compile %}}
      CROSS_COMPILE: "{{{{ cross_compile }}}}"
      {{% endif %}}
    build:
      - make -C /usr/src/linux-build M=/tmp/build/src modules
    install:
      - |
        make -C /usr/src/linux-build M=/tmp/build/src INSTALL_MOD_PATH=/out/usr INSTALL_MOD_DIR=extra \\
          INSTALL_MOD_STRIP=1 DEPMOD=true modules_install
        find /out/usr/lib/modules -type f ! -name '*.ko' -delete
finalize:
  - from: /out
    to: /
"""

MODULE_C = """\
// {module}: says hello when loaded. Replace with your driver.
#include <linux/init.h>
#include <linux/module.h>

static int __init {module}_init(void)
{{
\tpr_info("{module}: loaded\\n");
\treturn 0;
}}

static void __exit {module}_exit(void)
{{
}}

module_init({module}_init);
module_exit({module}_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("{name}");
"""

README = """\
# {name}

A Kiln system extension ({kind}). The package is `pkgs/{name}/pkg.yaml`; `kiln-project.yaml` puts
the stock package tree ({stock}) before this project's own.

- `kiln extension build {name}`: build it and the kernel, check it as `kiln image` would, and
  write its layer to `_out/extensions/`.
- `kiln dev boot --extension {name}`: boot an image with it in QEMU, to machined's ready line.
- `kiln image metal --extension {name}`: a disk image with it.

See Kiln's docs/extensions.md.
"""


def _major_minor(version: str) -> tuple[int, int]:
    major, minor, *_ = [*(int(part) for part in re.findall(r"\d+", version)[:2]), 0, 0]
    return major, minor


def _kernel_range(stock: Path) -> str:
    """The `kernel:` line for the stock tree's kernel series (vars.yaml's kernel_version), or none."""
    try:
        variables = yaml.safe_load((stock / "vars.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return ""
    version = variables.get("kernel_version") if isinstance(variables, dict) else None
    if not isinstance(version, str) or not re.match(r"^\d+\.\d+", version):
        return ""
    major, minor = _major_minor(version)
    return f'  kernel: ">={major}.{minor},<{major}.{minor + 1}"\n'


def create_extension(name: str, directory: Path, stock: Path, kind: str, author: str, kiln_version: str) -> list[Path]:
    """Write a new extension project into `directory` (absent or empty); returns the files written."""
    if not _NAME.match(name):
        raise InputError(f"extension name {name!r}: use lowercase letters, digits and '-', starting with either")
    if kind not in KINDS:
        raise InputError(f"--kind {kind}: choose {' or '.join(KINDS)}")
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise InputError(f"{directory} is not an empty directory: kiln init writes a new project only")
    if not stock.is_dir():
        raise InputError(f"the stock package tree {stock} is not a directory (give it with --pkgs)")
    major, minor = _major_minor(kiln_version)
    fields = {
        "name": name,
        "module": name.replace("-", "_"),
        "kind": kind,
        "author": author,
        "kiln_minor": f"{major}.{minor}",
        "kiln_next": f"{major}.{minor + 1}",
        "stock": os.path.relpath(stock.resolve(), directory.resolve()),
        "kernel_range": _kernel_range(stock),
    }
    files = {"kiln-project.yaml": PROJECT, "README.md": README}
    if kind == "service":
        files |= {f"pkgs/{name}/pkg.yaml": SERVICE_PKG, f"pkgs/{name}/{name}.c": SERVICE_C}
        files[f"pkgs/{name}/{name}.json"] = SERVICE_JSON
    else:
        files |= {f"pkgs/{name}/pkg.yaml": MODULE_PKG, f"pkgs/{name}/src/{fields['module']}.c": MODULE_C}
        files[f"pkgs/{name}/src/Kbuild"] = "obj-m := {module}.o\n"
    written = []
    for rel, template in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**fields))
        written.append(path)
    return written
