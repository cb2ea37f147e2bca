"""Benchmark and proof: every package built twice, cold, in two empty stores, and the results compared.

Each store gets its own freshly bootstrapped seed and builds the targets (default: every package
of the tree for linux/amd64, the full toolchain and the kernel included) from nothing; then every
package's stored file list (path, type, mode, size, sha256 of each file) is compared between the two
stores under the same key, and every shipped profile is assembled from each store and the
top-level SHA256SUMS compared. Downloaded sources are shared (copied from the first store's cache
into the second before it starts): they are checked by sha256 either way and are inputs, not
outputs. Results go to bench/results/repro.json and a table on stdout (the README shows it).

`--first DIR` takes an existing store (e.g. ~/.cache/kiln) as the first build instead of building
one, which halves the time; `--first A --second B` builds nothing and compares every entry two
existing stores both hold (e.g. this machine's store against a cold CI run's, each built from an
empty store on its own seed). The results record which. Run: `.venv/bin/python bench/repro.py
[--first DIR [--second DIR]] [--work DIR] [TARGET...]` (a full run of both stores: about 90 minutes
on 2 cores).

`--rebuild [--store-from DIR [--drop PKG,...]] [--runner R] [PROFILE...]` checks a release as its
users would: it releases the profiles (default metal and iso) from this commit, signed with keys
made for the run, then times `kiln verify --rebuild` of that release (a scratch checkout of the
recorded commit building every directory again and comparing each artifact's sha256 with
SHA256SUMS). Without --store-from the rebuild's store starts empty (every package built cold: about
an hour here); `--store-from ~/.cache/kiln` gives it a hard-linked copy of that store's entries,
so the packages are found and what is measured is the checkout, the imager and the comparison;
`--drop` leaves packages out of the copy, so the rebuild builds them again, with `--runner docker`
on the other runner. The tree must be committed (the provenance names the commit). Its result is the
`rebuild` entry of bench/results/repro.json (`rebuild_cold` from an empty store; `_RUNNER` added for
--runner), with the seconds of each package the rebuild compiled. From an empty store, the rebuild's
build phases are a cold `make image` (`kiln image metal iso` in a store of its own), so the other
phases (checkout, compare) are what verifying costs beyond it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kiln.pkg.loader import load_tree
from kiln.pkg.variables import Platform

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results/repro.json"
PROFILES = sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml"))
KILN = [sys.executable, "-m", "kiln.cli"]


def kiln(cache: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    """Run kiln in the store `cache` (None: the one this environment uses); exit naming it if it fails."""
    env = {**os.environ, "KILN_PROGRESS": "plain"} | ({"KILN_CACHE": str(cache)} if cache else {})
    result = subprocess.run([*KILN, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(
            f"kiln {' '.join(args)} (KILN_CACHE={cache}) failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def build(cache: Path, targets: list[str]) -> tuple[dict[str, dict[str, Any]], float]:
    """Build the targets into `cache`; each package's key, status and seconds, and the wall time."""
    began = time.monotonic()
    report: dict[str, dict[str, dict[str, Any]]] = json.loads(kiln(cache, "build", *targets, "--json").stdout)
    return report["packages"], time.monotonic() - began


def entry_files(cache: Path, key: str) -> dict[str, Any]:
    """path -> its record (type, mode, size, sha256, link target) in the store entry's manifest."""
    manifest: dict[str, list[dict[str, Any]]] = json.loads((cache / "store" / key / "manifest.json").read_text())
    return {record["path"]: record for record in manifest["files"]}


def compare_packages(first: Path, second: Path, packages: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name, info in sorted(packages.items()):
        key = info["key"]
        a, b = entry_files(first, key), entry_files(second, key)
        differing = sorted(path for path in set(a) | set(b) if a.get(path) != b.get(path))
        rows.append(
            {
                "package": name,
                "key": key,
                "files": len(b),
                "identical": not differing,
                "differing": differing[:20],
                "seconds": info.get("seconds"),
            }
        )
    return rows


def compare_images(first: Path, second: Path, work: Path) -> dict[str, Any]:
    sums: dict[str, dict[str, str]] = {}
    for label, cache in (("first", first), ("second", second)):
        out = work / f"images-{label}"
        shutil.rmtree(out, ignore_errors=True)
        kiln(cache, "image", *PROFILES, "--out", str(out))
        pairs = (line.split("  ", 1) for line in (out / "SHA256SUMS").read_text().splitlines() if line)
        sums[label] = {name: digest for digest, name in pairs}
    a, b = sums["first"], sums["second"]
    differing = sorted(name for name in set(a) | set(b) if a.get(name) != b.get(name))
    return {"profiles": PROFILES, "artifacts": len(sums["second"]), "identical": not differing, "differing": differing}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="packages to build (default: every package of the tree)")
    parser.add_argument("--first", type=Path, help="an existing store to use as the first build")
    parser.add_argument("--work", type=Path, default=Path("/tmp/kiln-repro"), help="where the stores go")
    parser.add_argument(
        "--second",
        type=Path,
        help="an existing store built apart from the first (e.g. a cold CI run's): build nothing, compare "
        "every entry both hold",
    )
    parser.add_argument("--no-images", action="store_true", help="compare the stores only")
    parser.add_argument("--rebuild", action="store_true", help="release PROFILEs, then kiln verify --rebuild them")
    parser.add_argument(
        "--store-from", type=Path, help="with --rebuild: start the rebuild's store as a hard-linked copy of this one"
    )
    parser.add_argument(
        "--drop",
        default="",
        help="with --store-from: packages (a,b,...) whose entries the copy leaves out, so they build again",
    )
    parser.add_argument(
        "--runner", help="with --rebuild: where the rebuild builds packages (default: the recorded runner)"
    )
    args = parser.parse_args()
    if args.rebuild:
        dropped = [name for name in args.drop.split(",") if name]
        return rebuild_release(args.targets or ["metal", "iso"], args.store_from, dropped, args.runner, args.work)
    if args.second is not None:
        if args.first is None:
            parser.error("--second needs --first")
        return report(args, args.first, args.second, shared_entries(args.first, args.second), {}, [])
    targets = args.targets or sorted(load_tree(ROOT / "pkgs", Platform.parse("linux/amd64")).packages)
    args.work.mkdir(parents=True, exist_ok=True)
    first = args.first or args.work / "first"
    second = args.work / "second"
    shutil.rmtree(second, ignore_errors=True)
    if args.first is None:
        shutil.rmtree(first, ignore_errors=True)
    # an existing first store builds only what it lacks (its entries for these keys are kept)
    first_packages, first_seconds = build(first, targets)
    timings = {"first": first_seconds, "second": 0.0}
    if (first / "sources").is_dir():
        shutil.copytree(first / "sources", second / "sources", copy_function=os.link)
    packages, timings["second"] = build(second, targets)
    # the first store may have been built earlier: its keys for these targets are the second's
    built = sorted(n for n, i in first_packages.items() if i["status"] == "built")
    return report(args, first, second, packages, timings, built)


def rebuild_release(
    profiles: list[str], store_from: Path | None, dropped: list[str], runner: str | None, work: Path
) -> int:
    """Release `profiles` from this commit, `kiln verify --rebuild` them, record the `rebuild` entry."""
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True)
    if dirty.stdout.strip():
        raise SystemExit("bench/repro.py --rebuild: commit first (the provenance names the commit):\n" + dirty.stdout)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    shutil.rmtree(work, ignore_errors=True)
    keys, release = work / "keys", work / "release"
    kiln(None, "keys", "generate", str(keys))
    began = time.monotonic()
    kiln(None, "image", *profiles, "--keys", str(keys), "--out", str(release))
    released = time.monotonic() - began
    argv = ["verify", "--rebuild", str(release), "--key", str(keys / "release.pub")]
    store = work / "rebuild-store"
    store.mkdir(parents=True)
    if store_from is not None:  # entries are never written in place: links are safe to share
        for part in ("store", "sources"):
            subprocess.run(["cp", "-al", str(store_from / part), str(store / part)], check=True)
        for meta in (store / "store").glob("*/meta.json"):
            if json.loads(meta.read_text())["name"] in dropped:
                shutil.rmtree(meta.parent)
    argv += ["--json", "--store", str(store)] + (["--runner", runner] if runner else [])
    began = time.monotonic()
    done = subprocess.run(KILN + argv, cwd=ROOT, capture_output=True, text=True)
    rebuilt = time.monotonic() - began
    if not done.stdout.startswith("{") or "directories" not in done.stdout:
        raise SystemExit(f"kiln verify --rebuild failed:\n{done.stdout}\n{done.stderr[-4000:]}")
    outcome = json.loads(done.stdout)
    compared = [(d["profile"], len(d["same"]), len(d["differences"])) for d in outcome["directories"]]
    entry = {
        "commit": commit,
        "profiles": profiles,
        "store": f"a hard-linked copy of {store_from}" if store_from else "a new empty store",
        "rebuilt_packages": dropped if store_from else "all",
        "runner": runner or "as recorded",
        "ok": outcome["ok"],
        "artifacts": {name: {"same": same, "different": different} for name, same, different in compared},
        "seconds": {"release": round(released, 1), "verify_rebuild": round(rebuilt, 1)},
        "ratio_verify_rebuild_to_release": round(rebuilt / released, 2),
        "phases": outcome["phases"],
        "package_seconds": built_here(store, store_from),
        "cores": os.cpu_count(),
    }
    for name, same, different in compared:
        print(f"{name:12s} {same:3d} artifacts the same, {different} different")
    verdict = "ok" if outcome["ok"] else "FAILED"
    ratio = entry["ratio_verify_rebuild_to_release"]
    print(f"release {released:.0f} s, verify --rebuild {rebuilt:.0f} s ({ratio} x; {entry['store']}): {verdict}")
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    # one entry per kind of store and runner
    label = "rebuild" + ("" if store_from else "_cold") + (f"_{runner}" if runner else "")
    RESULTS.write_text(json.dumps(stored | {label: entry}, indent=2) + "\n")
    return 0 if outcome["ok"] else 1


def built_here(store: Path, store_from: Path | None) -> dict[str, float]:
    """Each package the rebuild compiled into `store` (not one copied from `store_from`): its build seconds."""
    copied = {p.name for p in (store_from / "store").iterdir()} if store_from else set()
    seconds = {}
    for meta_path in sorted((store / "store").glob("*/meta.json")):
        if meta_path.parent.name not in copied:
            meta = json.loads(meta_path.read_text())
            seconds[meta["name"]] = meta.get("meta", {}).get("seconds")
    return dict(sorted(seconds.items(), key=lambda item: -(item[1] or 0)))


def shared_entries(first: Path, second: Path) -> dict[str, dict[str, Any]]:
    """Every store entry (but the seed) both stores hold under one key: label -> key, seconds."""

    def entries(cache: Path) -> dict[str, dict[str, Any]]:
        found = {}
        for meta_path in (cache / "store").glob("*/meta.json"):
            meta = json.loads(meta_path.read_text())
            if meta["name"] != "stage0":
                found[meta["key"]] = meta
        return found

    a, b = entries(first), entries(second)
    shared = sorted(set(a) & set(b), key=lambda key: (b[key]["name"], key))
    names = [b[key]["name"] for key in shared]
    return {
        (b[key]["name"] if names.count(b[key]["name"]) == 1 else f"{b[key]['name']}@{key[:8]}"): {
            "key": key,
            "seconds": b[key]["meta"].get("seconds"),
        }
        for key in shared
    }


def report(
    args: argparse.Namespace,
    first: Path,
    second: Path,
    packages: dict[str, dict[str, Any]],
    timings: dict[str, float],
    built_in_first: list[str],
) -> int:
    rows = compare_packages(first, second, packages)
    images = None if args.no_images else compare_images(first, second, args.work)
    result = {
        "platform": "linux/amd64",
        "first": f"existing store {args.first}" if args.first else "built cold in this run",
        "second": f"existing store {args.second}" if args.second else "built cold in this run",
        "built_in_first": built_in_first,
        "seconds": {k: round(v, 1) for k, v in timings.items()},
        "cores": os.cpu_count(),
        "packages": rows,
        "identical_packages": sum(r["identical"] for r in rows),
        "images": images,
    }
    print(f"{'package':24s} {'files':>6s}  {'second build':>12s}  identical")
    for row in rows:
        seconds = f"{row['seconds']:.0f} s" if row["seconds"] is not None else "-"
        print(f"{row['package']:24s} {row['files']:6d}  {seconds:>12s}  {'yes' if row['identical'] else 'NO'}")
    print(f"{result['identical_packages']} of {len(rows)} packages identical, file for file")
    if images:
        print(f"images: {images['artifacts']} files of {len(PROFILES)} profiles, identical: {images['identical']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    kept = {key: value for key, value in stored.items() if key.startswith("rebuild")}  # --rebuild's entries
    RESULTS.write_text(json.dumps(result | kept, indent=2) + "\n")
    return 0 if all(r["identical"] for r in rows) and (images is None or images["identical"]) else 1


if __name__ == "__main__":
    sys.exit(main())
