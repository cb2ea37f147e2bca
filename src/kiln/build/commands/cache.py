"""`kiln cache ls|verify|gc|rm|push|pull`: the store seen, cleaned and shared from the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kiln.build import buildcache
from kiln.build.sources.cache import remove_stale_partials, verify_sources
from kiln.build.store import Entry, Store
from kiln.core import console
from kiln.core.errors import InputError
from kiln.core.paths import cache_dir
from kiln.core.sizes import format_size, parse_size
from kiln.core.verb import Context
from kiln.pkg.graph import Graph
from kiln.pkg.options import add_tree_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`kiln cache ACTION`: only `pull` reads the package tree (what its targets need)."""
    actions = parser.add_subparsers(dest="cache_verb", metavar="ACTION", required=True)
    ls = actions.add_parser("ls", help="list store entries")
    ls.add_argument("--json", action="store_true", help="the entries as JSON: key, name, size, files")
    verify = actions.add_parser("verify", help="check entries against their recorded file lists")
    verify.add_argument("keys", nargs="*", metavar="KEY|NAME")
    verify.add_argument("--json", action="store_true", help="the result as JSON: ok, damaged entries")
    gc = actions.add_parser("gc", help="remove stale temporary dirs; with --max-size evict least used")
    gc.add_argument("--max-size", metavar="SIZE", help="e.g. 20G, 500M")
    gc.add_argument(
        "--build-caches", action="store_true", help="also empty the packages' step caches (a step's cache:)"
    )
    gc.add_argument("--json", action="store_true", help="what was removed, as JSON")
    rm = actions.add_parser("rm", help="remove entries by key (or prefix) or package name")
    rm.add_argument("keys", nargs="+", metavar="KEY|NAME")
    rm.add_argument("--json", action="store_true", help="what was removed, as JSON")
    push = actions.add_parser("push", help="upload store entries to an OCI registry (default: all)")
    push.add_argument("ref", metavar="oci://HOST/REPO")
    push.add_argument("names", nargs="*", metavar="KEY|NAME")
    push.add_argument("--json", action="store_true", help="how many entries were pushed, as JSON")
    pull = actions.add_parser("pull", help="fetch what TARGETs (default: all packages) need from an OCI registry")
    add_tree_options(pull)
    pull.add_argument("ref", metavar="oci://HOST/REPO")
    pull.add_argument("names", nargs="*", metavar="TARGET")
    pull.add_argument("--json", action="store_true", help="the keys pulled, as JSON")


def resolve(store: Store, wanted: list[str]) -> list[Entry]:
    """Entries named by full key, unique key prefix, or package name (all its entries)."""
    entries = store.entries()
    chosen: dict[str, Entry] = {}
    for word in wanted:
        matches = [e for e in entries if e.key == word or e.name == word]
        if not matches and len(word) >= 6:
            matches = [e for e in entries if e.key.startswith(word)]
        if not matches:
            raise InputError(f"no store entry matches {word!r} (see kiln cache ls)")
        chosen.update((e.key, e) for e in matches)
    return list(chosen.values())


def run(ctx: Context[Graph]) -> int:
    args = ctx.args
    if args.cache_verb == "pull":
        graph = ctx.graph()
        targets = args.names or list(graph.order)
        graph.closure(targets)  # unknown names fail here, with a suggestion
        return pull(graph, targets, args.ref, json_output=args.json)
    verbs = {"ls": _ls, "verify": _verify, "gc": _gc, "rm": _rm, "push": _push}
    if args.cache_verb not in verbs:
        raise InputError(f"unknown cache action {args.cache_verb!r}")
    return verbs[args.cache_verb](Store(cache_dir()), args)


def _ls(store: Store, args: argparse.Namespace) -> int:
    entries = sorted(store.entries(), key=lambda e: (e.name, e.key))
    if args.json:
        print(json.dumps([{"key": e.key, "name": e.name, "size": e.size, "files": e.files} for e in entries]))
        return 0
    rows = [[e.name, e.key[:16], str(e.files), format_size(e.size)] for e in entries]
    total = sum(e.size for e in entries)
    console.print_table(f"store {store.root} ({format_size(total)})", ["name", "key", "files", "size"], rows)
    if cached := buildcache.size(store.root):
        print(f"build caches: {format_size(cached)} (kiln cache gc --build-caches empties them)")
    return 0


def _verify(store: Store, args: argparse.Namespace) -> int:
    """Entries against their manifests; with no KEYs, the downloaded sources too (fully re-hashed)."""
    entries = resolve(store, args.keys) if args.keys else store.entries()
    report: dict[str, Any] = {"entries": len(entries), "damaged": []}
    for entry in entries:
        problems = store.verify(entry.key)
        for problem in problems:
            report["damaged"].append({"name": entry.name, "key": entry.key, "problem": problem})
            if not args.json:
                console.error(f"{entry.name} {entry.key[:16]}: {problem}")
    bad = len({d["key"] for d in report["damaged"]})
    if not args.json:
        print(f"verified {len(entries)} entries: {bad} damaged")
    if not args.keys:
        checked, damaged = verify_sources(cache_dir())
        report["sources"] = {"checked": checked, "damaged": damaged}
        if not args.json:
            for problem in damaged:
                console.error(problem)
            if checked:
                print(f"verified {checked} sources: {len(damaged)} damaged")
        bad += len(damaged)
    if args.json:
        print(json.dumps({"ok": not bad, **report}, indent=2))
    return 1 if bad else 0


def _gc(store: Store, args: argparse.Namespace) -> int:
    limit = parse_size(args.max_size) if args.max_size else None
    removed = store.gc(limit)
    partials = remove_stale_partials(cache_dir())
    caches = [str(p.relative_to(store.root)) for p in buildcache.remove_unheld(store.root)] if args.build_caches else []
    if args.json:
        report = {"removed": [str(r) for r in removed], "partial_downloads": len(partials), "build_caches": caches}
        print(json.dumps(report, indent=2))
        return 0
    print(f"removed {len(removed)} entries")
    if partials:
        print(f"removed {len(partials)} stale partial downloads")
    if args.build_caches:
        print(f"emptied {len(caches)} build caches")
    return 0


def _rm(store: Store, args: argparse.Namespace) -> int:
    removed = []
    for entry in resolve(store, args.keys):
        store.remove(entry.key)
        removed.append({"name": entry.name, "key": entry.key})
        if not args.json:
            print(f"removed {entry.name} {entry.key}")
    if args.json:
        print(json.dumps({"removed": removed}, indent=2))
    return 0


def _push(store: Store, args: argparse.Namespace) -> int:
    """`kiln cache push REF [KEY|NAME...]`: the named entries (default: every one) the registry lacks."""
    from kiln.build.remote import Ref, Registry

    keys = [e.key for e in (resolve(store, args.names) if args.names else store.entries())]
    sent = Registry(Ref.parse(args.ref)).push_all(store, keys)
    if args.json:
        print(json.dumps({"ref": args.ref, "entries": len(keys), "pushed": sent}, indent=2))
    else:
        print(f"pushed {sent} of {len(keys)} entries to {args.ref} (the rest were there)")
    return 0


def pull(graph: Graph, targets: list[str], ref: str, *, json_output: bool = False) -> int:
    """`kiln cache pull REF [TARGET...]`: what the targets' closure needs and the store lacks."""
    from kiln.build.session import Session

    pulled = Session.open(graph, "none").pull_needed(targets, ref)
    if json_output:
        print(json.dumps({"ref": ref, "pulled": pulled}, indent=2))
    else:
        print(f"pulled {len(pulled)} entries from {ref}")
    return 0
