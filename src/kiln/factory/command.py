"""`kiln factory serve`: the image factory over this project, its store and (when named) a registry.

It starts with the embedded defaults: the project's package tree and profiles, the local store,
its own directory at $KILN_CACHE/factory, and a write token made once (0600, in that directory)
unless `--token-file` or $KILN_FACTORY_TOKEN gives one. It needs no network: extensions come from
the tree, or from a registry when a schematic names one by reference.
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from pathlib import Path

from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.core.paths import cache_dir

TOKEN_ENV = "KILN_FACTORY_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("serve",), help="serve: answer HTTP until interrupted")
    parser.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="default 127.0.0.1:8080")
    parser.add_argument(
        "--root", type=Path, metavar="DIR", help="the factory's directory (default $KILN_CACHE/factory)"
    )
    parser.add_argument(
        "--token-file", type=Path, metavar="FILE", help=f"the write token (default ${TOKEN_ENV}, else made)"
    )
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="builds at once (default 1)")
    parser.add_argument("--queue", type=int, default=8, metavar="N", help="builds waiting at most (default 8)")
    parser.add_argument("--profiles-dir", metavar="DIR", help="the profiles served (default: the project's profiles/)")
    parser.add_argument(
        "--cache-from", metavar="oci://HOST/REPO", help="a registry cache its builds pull packages from first"
    )


def token(root: Path, given: Path | None) -> str:
    """The write token: --token-file, $KILN_FACTORY_TOKEN, or one made once and kept in root/token (0600)."""
    if given is not None:
        text = given.read_text().strip()
    elif os.environ.get(TOKEN_ENV):
        text = os.environ[TOKEN_ENV].strip()
    else:
        kept = root / "token"
        if not kept.exists():
            fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(32) + "\n")
        text = kept.read_text().strip()
    if len(text) < 16:
        raise InputError("the factory's write token must be at least 16 characters")
    return text


def listen_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InputError(f"--listen {text!r}: expected HOST:PORT")
    return host, int(port)


def run(args: argparse.Namespace, project: Path, pkgs: tuple[Path, ...], profiles_dir: Path, version: str) -> int:
    from kiln.factory.builds import Builds
    from kiln.factory.catalog import Catalog, kiln_image_runner
    from kiln.factory.service import Factory, serve

    host, port = listen_address(args.listen)
    root = args.root or cache_dir() / "factory"
    root.mkdir(parents=True, exist_ok=True)
    catalog = Catalog.read(project, pkgs, profiles_dir, version)
    runner = kiln_image_runner(catalog, root / "schematics", args.cache_from)
    builds = Builds(root, runner, workers=args.workers, queue=args.queue)
    server = serve(Factory(catalog, builds, token(root, args.token_file)), host, port)
    where = args.token_file or (f"${TOKEN_ENV}" if os.environ.get(TOKEN_ENV) else root / "token")
    say_line(
        f"kiln factory: version {version}, {len(catalog.offers)} profiles, {len(catalog.extensions)} extensions; "
        f"http://{host}:{server.server_address[1]}/ (write token: {where})"
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
    return 0
