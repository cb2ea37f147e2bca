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
from typing import TYPE_CHECKING

from kiln import __version__
from kiln.core.console import say_line
from kiln.core.errors import InputError
from kiln.core.paths import cache_dir
from kiln.core.release_version import VERSION_VARIABLE
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options, package_trees

if TYPE_CHECKING:  # the server is imported when the factory serves, not when a command line is parsed
    from kiln.factory.server import Limits

TOKEN_ENV = "KILN_FACTORY_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_tree_options(parser)
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
    parser.add_argument("--tls-cert", type=Path, metavar="FILE", help="serve HTTPS with this certificate chain (PEM)")
    parser.add_argument("--tls-key", type=Path, metavar="FILE", help="the certificate's private key (PEM)")
    parser.add_argument(
        "--listen-http",
        metavar="HOST:PORT",
        help="with TLS, also plain HTTP here: downloads for firmware and iPXE without TLS (writes: this host only)",
    )
    parser.add_argument(
        "--allow-registry",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="a registry schematics may name (repeatable); without any: public addresses only",
    )
    parser.add_argument("--connections", type=int, default=64, metavar="N", help="connections at once (default 64)")
    parser.add_argument(
        "--waiting", type=int, default=32, metavar="N", help="requests waiting for builds at most (default 32)"
    )
    parser.add_argument(
        "--rate", type=float, default=20.0, metavar="N", help="requests per second per client (default 20; 0: no limit)"
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


def limits(args: argparse.Namespace) -> Limits:
    """The server's bounds from the flags: a client may hold a quarter of the connections (at least one)."""
    from kiln.factory.server import Limits

    if args.connections < 1 or args.waiting < 0 or args.rate < 0:
        raise InputError("--connections must be at least 1, --waiting and --rate at least 0")
    burst = max(1, int(args.rate * 5))
    return Limits(args.connections, max(1, args.connections // 4), args.rate, burst)


def run(ctx: Context[Graph]) -> int:
    args = ctx.args
    graph = ctx.graph()  # the tree must load: every build the factory runs starts from it
    version = str(graph.tree.variables.get(VERSION_VARIABLE) or __version__)
    trees = tuple(tree.resolve() for tree in package_trees(args))
    return serve_factory(args, ctx.project.root, trees, Path(args.profiles_dir).resolve(), version)


def serve_factory(
    args: argparse.Namespace, project: Path, pkgs: tuple[Path, ...], profiles_dir: Path, version: str
) -> int:
    """Serve until interrupted: the catalog of this project, the builds under --root, the listeners."""
    from kiln.factory.builds import Builds
    from kiln.factory.catalog import Catalog, kiln_image_runner
    from kiln.factory.guard import Registries, checked_runner
    from kiln.factory.service import serve, tls_context
    from kiln.factory.state import Factory

    listens = [(listen_address(args.listen), True)]  # (address, with TLS when given)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InputError("--tls-cert and --tls-key go together")
    if args.listen_http:
        if args.tls_cert is None:
            raise InputError("--listen-http is a plain listener beside a TLS one: it needs --tls-cert/--tls-key")
        listens.append((listen_address(args.listen_http), False))
    tls = tls_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    registries, bounds = Registries.of(args.allow_registry), limits(args)
    root = args.root or cache_dir() / "factory"
    root.mkdir(parents=True, exist_ok=True)
    catalog = Catalog.read(project, pkgs, profiles_dir, version)
    runner = checked_runner(
        kiln_image_runner(catalog, root / "schematics", args.cache_from), root / "schematics", registries
    )
    builds = Builds(root, runner, workers=args.workers, queue=args.queue)
    factory = Factory(catalog, builds, token(root, args.token_file), registries=registries, waiting=args.waiting)
    servers = [(serve(factory, host, port, bounds, tls if secure else None), host) for (host, port), secure in listens]
    where = args.token_file or (f"${TOKEN_ENV}" if os.environ.get(TOKEN_ENV) else root / "token")
    urls = [f"{'https' if s.tls else 'http'}://{host}:{s.server_address[1]}/" for s, host in servers]
    say_line(
        f"kiln factory: version {version}, {len(catalog.offers)} profiles, {len(catalog.extensions)} extensions; "
        f"{' and '.join(urls)} (write token: {where})"
    )
    if any(server.tls is None for server, _ in servers):
        say_line("kiln factory: plain HTTP: writes there are taken from this host only (TLS for others)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        for server, _ in servers:
            server.shutdown()
    return 0
