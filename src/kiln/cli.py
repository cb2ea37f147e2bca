"""Command line: argument parsing and dispatch only.

Over 400 lines because the parser of every verb is here; what a verb does lives in its room.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln import __version__
from kiln.boot import command as boot_command
from kiln.build import cancel
from kiln.build.keys import compute_keys
from kiln.build.progress import PROGRESS_ENV, PROGRESS_MODES
from kiln.build.progress import set_mode as set_progress_mode
from kiln.cloud import command as upload_command
from kiln.core import console
from kiln.core.environment import help_text as environment_help
from kiln.core.errors import InputError, InputErrors, KilnError
from kiln.core.project import PACKAGE_TREE, PROFILES_DIR, Project
from kiln.core.project import current as current_project
from kiln.core.release_version import VERSION_ENV, VERSION_VARIABLE, release_version
from kiln.image import command as image_command
from kiln.image import dev as dev_command
from kiln.image import extension_command, schematic_command
from kiln.installer import command as install_command
from kiln.installer import release_command
from kiln.node import command as node_command
from kiln.node import secrets_command
from kiln.pkg.graph import Graph
from kiln.pkg.loader import Tree, load_tree
from kiln.pkg.show import GRAPH_FORMATS, dump_yaml, render_graph
from kiln.pkg.template import render_string
from kiln.pkg.variables import DEFAULT_PLATFORM, Platform, host_platform, parse_overrides
from kiln.report import command as report_command
from kiln.report.graph import PICTURE_FORMATS, draw_graph
from kiln.report.output import write
from kiln.signing import command as keys_command
from kiln.signing import verify_command

if TYPE_CHECKING:
    from kiln.build.session import Session

Handler = Callable[[argparse.Namespace], int]
# --platform's default. It parses as None so `kiln image` can tell a profile's arch from an explicit --platform.


def _overrides(args: argparse.Namespace) -> dict[str, str]:
    """--set's variables, with kiln_version set to the release's one version (core.release_version)."""
    project: Project = args.project
    overrides = parse_overrides(args.set)
    overrides[VERSION_VARIABLE] = release_version(
        project.root, args.release_version, overrides, project.version, project.location("version")
    )
    return overrides


def _load(args: argparse.Namespace) -> Graph:
    from_tar = Path(args.from_tar) if args.from_tar else None
    platform = Platform.parse(args.platform or DEFAULT_PLATFORM)
    tree: Tree = load_tree(package_trees(args), platform, _overrides(args), from_tar)
    return Graph(tree)


# What a flag left unset takes when the project file does not say either.
BUILTIN_DEFAULTS: dict[str, object] = {"jobs": 2, "runner": "sandbox", "cache_from": None, "cache_to": None}


def package_trees(args: argparse.Namespace) -> list[Path]:
    """The --pkgs trees in order (apply_project has filled in the project's)."""
    return [Path(tree) for tree in args.pkgs]


def apply_project(args: argparse.Namespace) -> None:
    """Fill what the command line left unset: from kiln-project.yaml (found by walking up from the
    working directory), then the built-in defaults. The tree and profiles are the project's."""
    set_progress_mode(args.progress)
    project = current_project()
    args.project = project
    if args.pkgs is None:
        args.pkgs = [str(project.root / tree) for tree in project.pkgs] or [str(project.root / PACKAGE_TREE)]
    if getattr(args, "profiles_dir", "") is None:
        args.profiles_dir = str(project.root / PROFILES_DIR)
    for name, builtin in BUILTIN_DEFAULTS.items():
        if hasattr(args, name) and getattr(args, name) is None:
            setattr(args, name, getattr(project, name) or builtin)


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        graph = _load(args)
        compute_keys(graph)
    except KilnError as exc:
        if not args.json:
            raise
        errors = exc.errors if isinstance(exc, InputErrors) else [exc]
        print(json.dumps({"ok": False, "errors": [error_json(e) for e in errors]}, indent=2))
        return exc.exit_code
    if args.json:
        print(json.dumps({"ok": True, "platform": str(graph.tree.platform), "packages": len(graph.order)}, indent=2))
    else:
        print(f"ok: {len(graph.order)} packages valid for {graph.tree.platform}")
    return 0


def error_json(error: KilnError) -> dict[str, Any]:
    """One error as `--json` prints it: the file and line apart from the message."""
    where = error.location
    return {
        "file": where.file if where else None,
        "line": where.line if where and where.line else None,
        "message": error.message,
    }


def cmd_ls(args: argparse.Namespace) -> int:
    graph = _load(args)
    keys = compute_keys(graph)
    packages = graph.tree.packages
    if args.json:
        data = {
            name: {"variant": p.variant, "version": p.version, "needs": graph.edges[name], "key": keys[name]}
            for name, p in packages.items()
        }
        print(json.dumps(data, indent=2))
        return 0
    rows = [
        [name, p.variant, p.version or "-", ",".join(graph.edges[name]) or "-", keys[name][:12]]
        for name, p in packages.items()
    ]
    console.print_table(f"packages ({graph.tree.platform})", ["name", "variant", "version", "needs", "key"], rows)
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    graph = _load(args)
    names = graph.closure(args.targets) if args.targets else graph.order
    keys = compute_keys(graph) if args.keys else None
    out = Path(args.out) if args.out else None
    if args.format in PICTURE_FORMATS:
        write(draw_graph(graph, names, args.format, keys), out, args.format)
    elif out is not None:
        out.write_text(render_graph(graph, names, args.format, keys) + "\n")
    else:
        print(render_graph(graph, names, args.format, keys))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    graph = _load(args)
    if args.target not in graph.tree.packages:
        graph.closure([args.target])  # raises with a suggestion
    context = graph.tree.package_context(graph.tree.packages[args.target])
    print(render_string(args.template, context))
    return 0


def cmd_dump(args: argparse.Namespace) -> int:
    graph = _load(args)
    names = graph.closure(args.targets) if args.targets else graph.order
    data = {name: graph.tree.packages[name].canonical() for name in names}
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(dump_yaml(data), end="")
    return 0


def cmd_bootstrap(args: argparse.Namespace) -> int:
    from kiln.build.session import Session

    session = Session.open(_load(args))
    key = session.bootstrap()
    print(f"stage0 {key}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from kiln.build.session import Session

    graph = _load(args)
    names = graph.closure(args.targets) if args.targets else graph.order
    fetched = Session.open(graph).fetch(names)
    if args.json:
        print(json.dumps({"fetched": fetched, "packages": names}, indent=2))
    else:
        print(f"fetched {fetched} source(s) for {len(names)} package(s)")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from kiln.build.session import Session, choose_progress, failures, outcome_json

    graph = _load(args)
    if args.all == bool(args.targets):
        raise InputError("name TARGETs to build, or --all (not both)")
    targets = list(graph.order) if args.all else args.targets
    graph.closure(targets)  # unknown names fail here, with a suggestion
    session = Session.open(graph, args.runner)
    if args.check or args.deep:
        return check_build(session, targets, args)
    outcomes = session.build(
        targets,
        args.jobs,
        choose_progress(json_output=args.json),
        no_cache=args.no_cache,
        keep_going=args.keep_going,
        cache_from=args.cache_from,
        cache_to=args.cache_to,
    )
    failed = failures(outcomes)
    for outcome in failed:
        console.error(str(outcome.error))
    if args.out and not failed:
        session.export(targets, Path(args.out))
    if args.json:
        print(outcome_json(outcomes))
    return 1 if failed else 0


def check_build(session: Session, targets: list[str], args: argparse.Namespace) -> int:
    """kiln build --check [--deep]: 1 when a rebuild differs from what is stored."""
    from kiln.build.check import summary_line
    from kiln.build.session import choose_progress

    if args.no_cache or args.cache_to or args.out:
        raise InputError("--check compares rebuilds with the store: it takes no --no-cache, --cache-to or --out")
    checked = session.check(
        targets,
        deep=args.deep,
        jobs=args.jobs,
        progress=choose_progress(json_output=args.json),
        say=lambda line: print(f"kiln check: {line}", file=sys.stderr, flush=True),
    )
    if args.json:
        print(json.dumps({"packages": {c.name: c.as_json() for c in checked}}, indent=2))
    else:
        for result in checked:
            print(summary_line(result))
    return 0 if all(c.same for c in checked) else 1


def cmd_shell(args: argparse.Namespace) -> int:
    from kiln.build.session import Session, shell

    graph = _load(args)
    graph.closure([args.target])
    return shell(Session.open(graph, args.runner), args.target, args.command or ["/bin/bash", "-i"])


def cmd_export(args: argparse.Namespace) -> int:
    from kiln.build.dockerfile import OUTPUTS
    from kiln.build.session import Session

    graph = _load(args)
    names = graph.closure(args.targets)
    out = Path(args.out)
    session = Session.open(graph, "none")
    export = session.export_dockerfile(
        names, args.targets, out, stage0=args.stage0, network_flags=not args.no_network_flags
    )
    print(f"wrote {export.dockerfile} ({len(names)} packages) and its build context in {out}")
    print(f"build: DOCKER_BUILDKIT=1 docker build --target {OUTPUTS} --output type=local,dest=OUT {out}")
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    from kiln.build.builder import logs_dir
    from kiln.build.store import Store
    from kiln.core.paths import cache_dir

    last = logs_dir(Store(cache_dir())) / args.target / "last.log"
    if not last.exists():
        raise InputError(f"no build log for '{args.target}' (build it first)")
    sys.stdout.write(last.read_text(errors="replace"))
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from kiln.build import cache_cmd

    if args.cache_verb == "pull":
        graph = _load(args)
        targets = args.names or list(graph.order)
        graph.closure(targets)  # unknown names fail here, with a suggestion
        return cache_cmd.pull(graph, targets, args.ref, json_output=args.json)
    return cache_cmd.run(args)


def cmd_kernel(args: argparse.Namespace) -> int:
    from kiln.build.session import Session
    from kiln.kernel import tool

    arch = args.arch or Platform.parse(args.platform or DEFAULT_PLATFORM).arch
    from_tar = Path(args.from_tar) if args.from_tar else None
    tree = load_tree(package_trees(args), host_platform(), _overrides(args), from_tar)
    output = Path(args.output) if args.output else None
    result = tool.run(Session.open(Graph(tree)), args.kernel_verb, arch, output)
    if args.json:
        written = str(result.written) if result.written is not None else None
        fields = {
            "arch": arch,
            "written": written,
            "changed": result.changed,
            "output": str(output) if output else None,
        }
        print(json.dumps(fields, indent=2))
        return 0
    if result.written is None:
        print("kernel_fragments is set: the main config was left as it is (fragments stay separate)")
    else:
        print(f"{'wrote' if result.changed else 'unchanged:'} {result.written}")
    if output is not None:
        print(f"full .config written to {output}")
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    def load(platform: str) -> Graph:
        args.platform = platform
        return _load(args)

    return image_command.run(args, load)


def cmd_dev(args: argparse.Namespace) -> int:
    return dev_command.run(_load(args), args)


def cmd_extension(args: argparse.Namespace) -> int:
    return extension_command.run(_load(args), args)


def cmd_factory(args: argparse.Namespace) -> int:
    from kiln.factory import command as factory_command

    graph = _load(args)  # the tree must load: every build the factory runs starts from it
    version = str(graph.tree.variables.get(VERSION_VARIABLE) or __version__)
    trees = tuple(tree.resolve() for tree in package_trees(args))
    return factory_command.run(args, args.project.root, trees, Path(args.profiles_dir).resolve(), version)


def cmd_init(args: argparse.Namespace) -> int:
    from kiln.pkg.scaffold import create_extension

    directory = Path(args.directory)
    stock = package_trees(args)[0]
    written = create_extension(args.extension, directory, stock, args.kind, args.author, __version__)
    for path in written:
        print(path)
    print(
        f"kiln init: extension project {args.extension} in {directory}; next: cd {directory} && "
        f"kiln extension build {args.extension}",
        file=sys.stderr,
    )
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    def load(platform: str) -> Graph:
        args.platform = platform
        return _load(args)

    return install_command.run(args, load)


def cmd_release(args: argparse.Namespace) -> int:
    def load(platform: str) -> Graph:
        args.platform = platform
        return _load(args)

    return release_command.run(args, load)


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching: `--js` is an error, not `--json`, so an abbreviation in a
    script cannot start meaning another option when one is added. Subparsers inherit the class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def _add_common(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options of every verb that reads the package tree. The root parser holds them with their
    defaults (so they may come before the verb: `kiln --pkgs DIR build`); each verb holds them with
    no default, so one given after the verb wins and one given before it is not reset."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--pkgs",
        action="append",
        default=default(None),
        metavar="DIR",
        help="package tree (default: the project's `pkgs` setting, else its pkgs/; the project is the nearest "
        "directory up holding kiln-project.yaml, else pkgs/); repeat it to load several trees as one, the "
        "stock tree first (an extension author's tree after it)",
    )
    parser.add_argument(
        "--platform",
        default=default(None),
        help="target platform: linux/amd64 (default; for kiln image, the profiles' arch) or linux/arm64; "
        "kiln image and kiln release push take a comma-separated list (linux/amd64,linux/arm64)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=default([]),
        metavar="KEY=VALUE",
        help="override a template variable (string value); repeatable, wins over vars.yaml",
    )
    parser.add_argument(
        "--release-version",
        default=default(None),
        metavar="VERSION",
        help=f"the release's one version (os-release, machined, manifests, SBOMs, installer tag, ISO label); "
        f"default ${VERSION_ENV}, the project's version:, else the git describe of the project",
    )
    parser.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default=default(None),
        help=f"how builds show progress: auto (a live view on a terminal, else lines; default, or ${PROGRESS_ENV}), "
        "plain (lines) or tty (the live view even into a pipe)",
    )
    parser.add_argument(
        "--from-tar",
        default=default(None),
        metavar="PATH",
        help="use this root tarball or OCI archive as stage0 instead of debootstrap",
    )


def _common() -> Parser:
    common = Parser(add_help=False)
    _add_common(common, defaults=False)
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kiln",
        description="Build minimal, immutable Linux images from a declarative package graph.",
        epilog=environment_help() + "\n\ndocs/cli.md: the grammar, the project file and these variables.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    _add_common(parser, defaults=True)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    common = _common()

    def verb(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    validate = verb(
        "validate", cmd_validate, "check every pkg.yaml of the tree; print all errors as file:line: message"
    )
    validate.add_argument("--json", action="store_true", help="the result, or every error, as JSON")
    ls = verb("ls", cmd_ls, "list packages with variant, version, what they need and their cache key")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    graph = verb("graph", cmd_graph, "print the dependency graph (build order), optionally of TARGETs only")
    graph.add_argument("targets", nargs="*", metavar="TARGET", help="limit to these packages and their needs")
    graph.add_argument(
        "--format",
        choices=GRAPH_FORMATS + PICTURE_FORMATS,
        default="dot",
        help="output format (default: dot); svg and png are drawn by Graphviz's dot",
    )
    graph.add_argument("-o", "--out", metavar="FILE", help="write to FILE instead of stdout (a png must go to a file)")
    graph.add_argument("--json", action="store_const", dest="format", const="json", help="the same as --format json")
    graph.add_argument("--keys", action="store_true", help="label nodes with their cache keys")
    ev = verb(
        "eval",
        cmd_eval,
        "render a Jinja2 template with TARGET's variables, e.g. kiln eval toolchain-seed '{{ target }}'",
    )
    ev.add_argument("target", metavar="TARGET")
    ev.add_argument("template", metavar="TEMPLATE")
    dump = verb("dump", cmd_dump, "print the rendered, canonical spec of every package (or of TARGETs)")
    dump.add_argument("targets", nargs="*", metavar="TARGET")
    dump.add_argument("--json", action="store_true", help="JSON instead of YAML")

    verb("bootstrap", cmd_bootstrap, "make the stage0 seed root (debootstrap, or --from-tar PATH) and store it")
    fetch = verb("fetch", cmd_fetch, "download and verify the sources of TARGETs (default: all packages)")
    fetch.add_argument("targets", nargs="*", metavar="TARGET")
    fetch.add_argument("--json", action="store_true", help="machine-readable summary")
    build = verb("build", cmd_build, "build TARGETs and what they need, in parallel, skipping stored keys")
    build.add_argument("targets", nargs="*", metavar="TARGET")
    build.add_argument("--all", action="store_true", help="build every package of the tree")
    build.add_argument(
        "--jobs", "-j", type=int, metavar="N", help="packages built at once (default 2, or the project's jobs:)"
    )
    build.add_argument("--no-cache", action="store_true", help="rebuild even what is stored (not stage0)")
    build.add_argument(
        "--check",
        action="store_true",
        help="build TARGETs again in a fresh root and compare with their stored outputs file by file; exit 1 "
        "when one differs (its files and diffoscope reports kept under $KILN_CACHE/check/)",
    )
    build.add_argument("--deep", action="store_true", help="with --check: check every package TARGETs need too")
    build.add_argument("--keep-going", "-k", action="store_true", help="after a failure, build what does not need it")
    build.add_argument("--out", metavar="DIR", help="export each target's output to DIR/<name>/")
    build.add_argument("--json", action="store_true", help="print a JSON summary of every package at the end")
    build.add_argument(
        "--runner",
        choices=["sandbox", "docker", "buildkit"],
        help="where steps run (default sandbox, or the project's runner:): sandbox (bubblewrap), "
        "docker (an engine at DOCKER_HOST), "
        "buildkit (the graph as one Dockerfile)",
    )
    build.add_argument("--cache-from", metavar="oci://HOST/REPO", help="pull needed entries from this registry first")
    build.add_argument("--cache-to", metavar="oci://HOST/REPO", help="push the closure's entries to this registry")
    sh = verb("shell", cmd_shell, "open a shell in TARGET's build root (dependencies merged, sources in place)")
    sh.add_argument("--runner", choices=["sandbox", "docker"], help="where the root is made (default sandbox)")
    sh.add_argument("target", metavar="TARGET")
    sh.add_argument("command", nargs="*", metavar="COMMAND", help="run this instead of an interactive bash")
    export = verbs.add_parser(
        "export", help="write the graph for other build systems", description="write the graph for other build systems"
    )
    export_kinds = export.add_subparsers(dest="export_kind", metavar="KIND", required=True)
    dockerfile = export_kinds.add_parser(
        "dockerfile",
        parents=[common],
        help="a multi-stage Dockerfile and build context for TARGETs' closure",
        description="a multi-stage Dockerfile (one stage per package) and its build context, for BuildKit",
    )
    dockerfile.set_defaults(handler=cmd_export)
    dockerfile.add_argument("targets", nargs="+", metavar="TARGET")
    dockerfile.add_argument("--out", required=True, metavar="DIR", help="context directory (emptied first)")
    dockerfile.add_argument(
        "--stage0",
        choices=["image", "tar"],
        default="image",
        help="seed as the image kiln/stage0:<key> (ARG KILN_STAGE0; default) or as a "
        "stage0.tar in the context (no image store needed)",
    )
    dockerfile.add_argument(
        "--no-network-flags",
        action="store_true",
        help="omit RUN --network= (frontends before dockerfile 1.3); isolate with "
        "`docker build --network none` instead",
    )
    log = verb("log", cmd_log, "print TARGET's last build log")
    log.add_argument("target", metavar="TARGET")

    cache = verbs.add_parser("cache", help="inspect and clean the store", description="inspect and clean the store")
    cache_verbs = cache.add_subparsers(dest="cache_verb", metavar="ACTION", required=True)
    cache_ls = cache_verbs.add_parser("ls", help="list store entries")
    cache_ls.add_argument("--json", action="store_true", help="the entries as JSON: key, name, size, files")
    cache_verify = cache_verbs.add_parser("verify", help="check entries against their recorded file lists")
    cache_verify.add_argument("keys", nargs="*", metavar="KEY|NAME")
    cache_verify.add_argument("--json", action="store_true", help="the result as JSON: ok, damaged entries")
    cache_gc = cache_verbs.add_parser("gc", help="remove stale temporary dirs; with --max-size evict least used")
    cache_gc.add_argument("--max-size", metavar="SIZE", help="e.g. 20G, 500M")
    cache_gc.add_argument(
        "--build-caches", action="store_true", help="also empty the packages' step caches (a step's cache:)"
    )
    cache_gc.add_argument("--json", action="store_true", help="what was removed, as JSON")
    cache_rm = cache_verbs.add_parser("rm", help="remove entries by key (or prefix) or package name")
    cache_rm.add_argument("keys", nargs="+", metavar="KEY|NAME")
    cache_rm.add_argument("--json", action="store_true", help="what was removed, as JSON")
    cache_push = cache_verbs.add_parser("push", help="upload store entries to an OCI registry (default: all)")
    cache_push.add_argument("ref", metavar="oci://HOST/REPO")
    cache_push.add_argument("names", nargs="*", metavar="KEY|NAME")
    cache_push.add_argument("--json", action="store_true", help="how many entries were pushed, as JSON")
    cache_pull = cache_verbs.add_parser(
        "pull", parents=[common], help="fetch what TARGETs (default: all packages) need from an OCI registry"
    )
    cache_pull.add_argument("ref", metavar="oci://HOST/REPO")
    cache_pull.add_argument("names", nargs="*", metavar="TARGET")
    cache_pull.add_argument("--json", action="store_true", help="the keys pulled, as JSON")
    cache.set_defaults(handler=cmd_cache)

    kernel = verbs.add_parser(
        "kernel",
        help="edit the kernel config in the kernel's build container",
        description="edit the kernel config in the kernel's build container",
    )
    kernel_verbs = kernel.add_subparsers(dest="kernel_verb", metavar="ACTION", required=True)
    for action, text in (
        ("menuconfig", "edit pkgs/kernel/config-ARCH interactively, then save it in savedefconfig form"),
        ("olddefconfig", "resolve config-ARCH (+ kernel_fragments) against the kernel source; write it back"),
        ("savedefconfig", "rewrite config-ARCH in minimal (savedefconfig) form"),
    ):
        sub = kernel_verbs.add_parser(action, parents=[common], help=text, description=text)
        sub.add_argument("--arch", choices=["amd64", "arm64"], help="which config (default: --platform's arch)")
        sub.add_argument("--output", metavar="FILE", help="also write the full resolved .config here")
        sub.add_argument("--json", action="store_true", help="what was written, as JSON")
    kernel.set_defaults(handler=cmd_kernel)

    image = verb(
        "image",
        cmd_image,
        "build what profiles need, then write their outputs (kiln image iso metal "
        "aws --out DIR); without a profile, vmlinuz and initramfs.zst",
    )
    image_command.add_arguments(image)

    dev = verb(
        "dev",
        cmd_dev,
        "the inner loop: kiln dev boot rebuilds what changed, writes vmlinuz and initramfs.zst to _out/dev "
        "and boots them to machined's ready line, with the time of each phase",
    )
    dev_command.add_arguments(dev)

    init = verb(
        "init",
        cmd_init,
        "start an extension project: kiln init --extension NAME DIR writes DIR/kiln-project.yaml (the stock tree "
        "of --pkgs, then its own), pkgs/NAME and a README",
    )
    init.add_argument("directory", metavar="DIR", help="where to write the project (absent or empty)")
    init.add_argument("--extension", required=True, metavar="NAME", help="the extension package's name")
    init.add_argument(
        "--kind",
        choices=("service", "module"),
        default="service",
        help="service: a static program machined supervises (default); module: an out-of-tree kernel module",
    )
    init.add_argument("--author", default="me", help="the extension's author, for its manifest")

    ext = verb(
        "extension",
        cmd_extension,
        "the extension author's loop: kiln extension build NAME builds NAME and the kernel, checks it as "
        "kiln image would (paths, Kiln and kernel ranges, vermagic) and writes its layer to _out/extensions",
    )
    extension_command.add_arguments(ext)

    factory = verb(
        "factory",
        cmd_factory,
        "serve images on demand: schematics in, any profile's outputs out, over HTTP (docs/factory.md)",
    )
    from kiln.factory.command import add_arguments as factory_arguments

    factory_arguments(factory)

    install = verb(
        "install",
        cmd_install,
        "write a profile's disk layout (default metal) onto a disk or disk "
        "file; a disk that is not empty needs --wipe, one in use is refused",
    )
    install_command.add_arguments(install)

    release = verbs.add_parser(
        "release",
        help="publish releases to an OCI registry or a cloud",
        description="publish releases to an OCI registry or a cloud",
    )
    release_verbs = release.add_subparsers(dest="release_verb", metavar="ACTION", required=True)
    release_push = release_verbs.add_parser(
        "push",
        parents=[common],
        help="push an installer image to HOST/REPO:<version> with release annotations (channel, architecture)",
        description="push an installer OCI layout (or its .tar, or an installer profile, built first) to a "
        "registry under the tag of its version, annotated with its channel, architecture and --upgrade-from",
    )
    release_command.add_arguments(release_push)
    release_push.set_defaults(handler=cmd_release)
    release_upload = release_verbs.add_parser(
        "upload",
        help="publish a kiln image output directory to a cloud: an AWS AMI (EBS snapshot, copies, SSM "
        "parameter) or an Azure page blob (the VHD, and the az command that makes its image)",
        description="publish a kiln image output directory to a cloud (docs/clouds.md)",
    )
    upload_command.add_arguments(release_upload)
    release_upload.set_defaults(handler=upload_command.run)

    def room_verb(name: str, room: Any, help_text: str, description: str | None = None) -> None:
        """A verb that reads no package tree: its room's add_arguments and run."""
        sub = verbs.add_parser(name, help=help_text, description=description or help_text)
        room.add_arguments(sub)
        sub.set_defaults(handler=room.run)

    room_verb("boot", boot_command, "boot an artifact in QEMU and wait for machined's ready line")
    room_verb(
        "node",
        node_command,
        "talk to running machines over machined's mutual-TLS API: status, logs, rollback, rolling upgrades",
        "talk to running machines over machined's mutual-TLS API (docs/node-client.md)",
    )
    room_verb(
        "secrets",
        secrets_command,
        "make a fleet's API certificates: two CAs, machines' (serverAuth) and clients' with a role",
        "make a fleet's API certificates: a machines CA and a clients CA, each machine's server certificate and "
        "api: section, each client's certificate (role admin, operator or reader) and kiln node config "
        "(docs/machine-config.md#the-api)",
    )
    room_verb(
        "keys",
        keys_command,
        "make your own Secure Boot, kernel module and release keys",
        "make your own Secure Boot, kernel module and release keys (docs/secure-boot.md)",
    )
    room_verb(
        "report",
        report_command,
        "pictures: a build's timeline (kiln build --json) or what takes the space in an image",
        "draw a build's timeline from kiln build --json, or measure what takes the space in an image",
    )
    room_verb(
        "schematic",
        schematic_command,
        "check a schematic and print its ID (what kiln image --schematic records and a factory serves)",
        "check a schematic (extensions, kernel arguments, machine config; docs/factory.md) and print its ID, "
        "the sha256 of its canonical form",
    )
    room_verb(
        "verify",
        verify_command,
        "check DIR against its SHA256SUMS, its provenance and the release key's signatures over them",
        "check that DIR holds exactly the files its SHA256SUMS lists, that SHA256SUMS.sig is the release key's "
        "signature over it, and that its provenance (provenance.intoto.jsonl) is signed by the same key and names "
        "the same files and digests (docs/release-signing.md, docs/provenance.md)",
    )

    completion = verbs.add_parser(
        "completion",
        help="print a shell completion script: source <(kiln completion bash)",
        description="print a completion script for SHELL (made from this parser: by shtab for bash, zsh and "
        "tcsh), e.g. `kiln completion bash > /etc/bash_completion.d/kiln`, `source <(kiln completion bash)` or "
        "`kiln completion fish > ~/.config/fish/completions/kiln.fish`",
    )
    completion.add_argument("shell", choices=COMPLETION_SHELLS, metavar="SHELL", help=", ".join(COMPLETION_SHELLS))
    completion.set_defaults(handler=cmd_completion)
    return parser


COMPLETION_SHELLS = ("bash", "zsh", "fish", "tcsh")


def cmd_completion(args: argparse.Namespace) -> int:
    if args.shell == "fish":
        from kiln.core.fish_completion import fish_script

        print(fish_script(build_parser(), "kiln"), end="")
        return 0
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`kiln ls --json | head -1`): not an error of Kiln's, and nothing more
        # can be printed; stdout goes to /dev/null so the interpreter's final flush stays quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        apply_project(args)
        with cancel.handlers():  # SIGINT/SIGTERM stop running steps; nothing half done is stored
            return int(args.handler(args))
    except cancel.Interrupted as exc:
        console.error(str(exc))
        return exc.exit_code
    except InputErrors as exc:
        for err in exc.errors:
            console.error(str(err))
        if len(exc.errors) > 1:
            console.error(f"{len(exc.errors)} errors")
        return exc.exit_code
    except KilnError as exc:
        if cancel.TOKEN.cancelled:  # a build step's error caused by the cancel itself
            interrupted = cancel.Interrupted(cancel.TOKEN.signum or signal.SIGINT)
            console.error(str(interrupted))
            return interrupted.exit_code
        console.error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        console.error("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
