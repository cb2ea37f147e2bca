"""`kiln node status|get|logs|rollback|upgrade|apply-config`: machined's API on the machines of a context.

Argument parsing and output only: the config is `config`, the HTTPS client `client`, the order and
the waiting of rollbacks and rolling upgrades `rollout`, following resources as they change `watch`.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from kiln.core import console
from kiln.core.errors import InputError, Location, printable
from kiln.core.verb import Context
from kiln.core.yamlfile import read_text_file
from kiln.node.client import ApiError, NodeClient, NodeError, UpgradeRequest
from kiln.node.config import Flags, Target, resolve
from kiln.node.rollout import Progress, Reporter, Rollout, rolling_rollback, rolling_upgrade
from kiln.node.watch import Change, watch_nodes

DEFAULT_TIMEOUT = 900.0
CHANNELS = ("alpha", "beta", "stable")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_MiB = 1 << 20
POLL = 1.0  # seconds between two status requests while a node upgrades or reboots
LINE_EVERY = 10.0  # plain progress: a line when the state changes, else at most one per node this often
OUTPUTS = ("table", "json", "yaml")
MAX_CONFIG = 1 << 20  # what machined accepts in POST /v1/config
REFUSED = (400, 409, 413)  # a machine's answers that refuse the config itself: exit 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`kiln node ACTION`, each action with the connection flags."""
    parser.description = "talk to running machines over machined's mutual-TLS API (docs/node-client.md)"
    connection = _connection_flags()
    actions = parser.add_subparsers(dest="node_action", metavar="ACTION", required=True)
    status = actions.add_parser(
        "status", parents=[connection], help="each node's version, boot slots, upgrade and services"
    )
    status.add_argument("--json", action="store_true", help="the status objects as one JSON list")
    get = actions.add_parser(
        "get", parents=[connection], help="each node's resources (its config, network, ...) as machined keeps them"
    )
    get.add_argument("type", nargs="?", default="", help="only this resource type, e.g. network/status")
    get.add_argument("id", nargs="?", default="", help="only the resource of this type with this ID")
    get.add_argument("-o", "--output", choices=OUTPUTS, default="table", help="table (default), json or yaml")
    get.add_argument("--json", dest="output", action="store_const", const="json", help="the same as -o json")
    get.add_argument("--watch", "-w", action="store_true", help="then print each change as it happens, until Ctrl-C")
    logs = actions.add_parser("logs", parents=[connection], help="a service's kept log lines from each node")
    logs.add_argument("service", nargs="?", default="machined", help="the service (default machined: its own log)")
    rollback = actions.add_parser(
        "rollback",
        parents=[connection],
        help="boot each node of --nodes from its other slot, one at a time, waiting for each to come back",
    )
    _add_timeout(rollback)
    rollback.add_argument("--json", action="store_true", help="print a JSON summary at the end")
    upgrade = actions.add_parser(
        "upgrade",
        parents=[connection],
        help="rolling upgrade: one node at a time, each back on the new version before the next; stops at a failure",
    )
    _add_upgrade_arguments(upgrade)
    apply = actions.add_parser(
        "apply-config",
        parents=[connection],
        help="send one node a new machine config: applied live where it can be, the rest at its next boot",
    )
    apply.add_argument("file", metavar="FILE", help="the machine config, YAML or JSON (docs/machine-config.md)")
    mode = apply.add_mutually_exclusive_group()
    mode.add_argument(
        "--mode",
        choices=("auto", "staged"),
        default="auto",
        help="auto (default): live where it can be, the rest at the next boot; staged: everything at the next boot",
    )
    mode.add_argument("--dry-run", action="store_true", help="only say what auto would do: nothing written or applied")
    apply.add_argument("--json", action="store_true", help="print the node's report as JSON")


def _connection_flags() -> argparse.ArgumentParser:
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument(
        "--config",
        metavar="FILE",
        help="the node config (default $KILN_NODECONFIG, else ~/.config/kiln/nodeconfig.yaml)",
    )
    flags.add_argument("--context", metavar="NAME", help="the config's context to use (default its `context`)")
    flags.add_argument(
        "--nodes", "-n", metavar="A,B,...", help="these endpoints (host[:port]) instead of the context's"
    )
    flags.add_argument("--ca", metavar="FILE", help="the CA certificate that signs the machines' certificates")
    flags.add_argument("--cert", metavar="FILE", help="this client's certificate")
    flags.add_argument("--key", metavar="FILE", help="this client's private key")
    return flags


def _add_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long each node may take, reboot included (default {DEFAULT_TIMEOUT:g})",
    )


def _add_upgrade_arguments(upgrade: argparse.ArgumentParser) -> None:
    source = upgrade.add_mutually_exclusive_group(required=True)
    source.add_argument("--image", metavar="REF", help="an installer image: HOST[:PORT]/REPO:TAG or REPO@sha256:...")
    source.add_argument("--url", metavar="URL", help="an installer tar over HTTPS")
    source.add_argument("--channel", choices=CHANNELS, help="the newest release of this channel in --repository")
    upgrade.add_argument("--digest", metavar="sha256:HEX", help="with --url: the tar's digest, checked by the node")
    upgrade.add_argument("--repository", metavar="HOST[:PORT]/REPO", help="with --channel: where the releases are")
    upgrade.add_argument("--no-preserve", action="store_true", help="do not keep the node's data on EPHEMERAL")
    upgrade.add_argument("--allow-downgrade", action="store_true", help="allow a version older than the running one")
    _add_timeout(upgrade)
    upgrade.add_argument("--json", action="store_true", help="print a JSON summary at the end")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 1e7:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0 seconds")
    return value


def run(ctx: Context[object]) -> int:
    """Resolve the config and the flags (exit 2 on a problem), then do the action (exit 1 on a node's failure)."""
    args = ctx.args
    flags = Flags(args.config, args.context, args.nodes, args.ca, args.cert, args.key)
    if args.node_action == "rollback" and not args.nodes:
        raise InputError("kiln node rollback reboots every node it is given: name them with --nodes A,B")
    request = upgrade_request(args) if args.node_action == "upgrade" else None
    target = resolve(flags)
    if request is not None:
        return _upgrade(args, target, request)
    actions: dict[str, Callable[[argparse.Namespace, Target], int]] = {
        "status": _status,
        "get": _get,
        "logs": _logs,
        "rollback": _rollback,
        "apply-config": _apply_config,
    }
    return actions[args.node_action](args, target)


def upgrade_request(args: argparse.Namespace) -> UpgradeRequest:
    """The POST /v1/upgrade body of the flags; the combinations argparse cannot check are InputErrors."""
    if args.digest and not args.url:
        raise InputError("--digest goes with --url (an image reference carries its own @sha256:)")
    if args.digest and not _DIGEST.fullmatch(args.digest):
        raise InputError(f"--digest {args.digest}: expected sha256: and 64 lower-case hex digits")
    if bool(args.channel) != bool(args.repository):
        raise InputError("--channel and --repository go together: the channel's releases are in the repository")
    return UpgradeRequest(
        image=args.image,
        url=args.url,
        digest=args.digest,
        channel=args.channel,
        repository=args.repository,
        preserve=not args.no_preserve,
        allow_downgrade=args.allow_downgrade,
    )


def _status(args: argparse.Namespace, target: Target) -> int:
    output = "json" if args.json else "table"
    return _ask_each(target, "status", lambda client: client.status(), status_lines, output=output)


def _ask_each(
    target: Target,
    key: str,
    ask: Callable[[NodeClient], Any],
    lines: Callable[[str, Any], list[str]],
    *,
    output: str,
) -> int:
    """Ask every node of `target`, then print the answers as one JSON or YAML list ({"node", key} or {"node",
    "error"}) or as each node's `lines`; a node that did not answer is a line on stderr and exit 1."""
    answers: list[dict[str, Any]] = []
    for client in target.clients():
        try:
            answers.append({"node": client.name, key: ask(client)})
        except NodeError as exc:
            answers.append({"node": client.name, "error": exc.reason})
    if output != "table":
        print(_dump(answers, output), end="")
    for answer in answers:
        if "error" in answer:
            console.error(f"{answer['node']}: {answer['error']}")
        elif output == "table":
            print("\n".join(lines(answer["node"], answer[key])))
    return 1 if any("error" in answer for answer in answers) else 0


def _dump(value: Any, output: str, *, document: bool = False) -> str:
    """JSON or YAML text ending in a newline; control characters come out escaped either way."""
    if output == "json":
        return json.dumps(value, indent=None if document else 2) + "\n"
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=False, explicit_start=document)


def status_lines(node: str, status: dict[str, Any]) -> list[str]:
    """One node's block of `kiln node status`; every value from the machine made printable."""
    kernel, hostname = _text(status.get("kernel")), _text(status.get("hostname"))
    uptime = status.get("uptime_seconds")
    lines = [f"{node}" + (f"  {hostname}" if hostname else "")]
    running = f"  version:   {_text(status.get('version')) or '?'}" + (f" (kernel {kernel})" if kernel else "")
    lines.append(running + (f", up {_duration(uptime)}" if isinstance(uptime, int | float) else ""))
    lines += _boot_lines(status.get("boot"))
    lines.append(f"  upgrade:   {_upgrade_text(status.get('upgrade'))}")
    lines.append(f"  services:  {_services_text(status.get('services'))}")
    return lines


def _boot_lines(boot: Any) -> list[str]:
    if not isinstance(boot, dict):
        return ["  boot:      not from an A/B disk"]
    slot, default = _text(boot.get("slot")), _text(boot.get("default"))
    lines = [f"  boot:      slot {slot or '?'} as {_text(boot.get('booted_as')) or '?'} (default {default or '?'})"]
    previous = _text(boot.get("previous_version")) or "empty"
    lines.append(f"  previous:  slot {_text(boot.get('previous_slot')) or '?'}: {previous}")
    if boot.get("rolled_back"):
        rolled = _text(boot.get("rolled_back_slot"))
        version = _text(boot.get("rolled_back_version"))
        lines.append(f"  rolled back: yes (slot {rolled or '?'}" + (f", {version})" if version else ")"))
    else:
        lines.append("  rolled back: no")
    trial = boot.get("trial")
    if isinstance(trial, dict):
        lines.append(f"  trial:     slot {_text(trial.get('slot'))}, {_text(trial.get('tries_left'))} tries left")
    if boot.get("error"):
        lines.append(f"  boot error: {_text(boot.get('error'))}")
    return lines


def _upgrade_text(upgrade: Any) -> str:
    if not isinstance(upgrade, dict) or not upgrade.get("state"):
        return "idle"
    state = _text(upgrade.get("state"))
    source = _text(upgrade.get("image") or upgrade.get("url") or "")
    version = _text(upgrade.get("version"))
    text = state + _mib(upgrade.get("pulled_bytes"), upgrade.get("total_bytes"))
    text += f" {source}" if source else ""
    text += f" -> {version}" if version else ""
    text += " (unsigned)" if upgrade.get("unsigned") is True else ""
    if state == "failed":
        text += f": {_text(upgrade.get('error')) or 'no reason given'}"
    return text


def _services_text(services: Any) -> str:
    if not isinstance(services, list) or not services:
        return "none"
    states: dict[str, list[str]] = {}
    for service in services:
        if isinstance(service, dict):
            states.setdefault(_text(service.get("state")) or "?", []).append(_text(service.get("name")))
    parts = [f"{len(names)} {state}" for state, names in sorted(states.items())]
    troubled = sorted(name for state in ("failed", "backoff") for name in states.get(state, []))
    return ", ".join(parts) + (f" ({', '.join(troubled)})" if troubled else "")


def _get(args: argparse.Namespace, target: Target) -> int:
    if args.id and not args.type:
        raise InputError("kiln node get: an ID goes after its TYPE")
    if args.watch:
        return _watch(args, target)
    return _ask_each(
        target,
        "resources",
        lambda client: client.resources(args.type, args.id),
        resource_lines,
        output=args.output,
    )


def _watch(args: argparse.Namespace, target: Target) -> int:
    """Each change of each node's resources as it comes, until Ctrl-C: a table row, a JSON line or a YAML document."""
    if args.output == "table":
        print(_watch_row(["NODE", "EVENT", "TYPE", "ID", "VERSION", "PHASE", "OWNER"], "SPEC"), flush=True)

    def emit(change: Change) -> None:
        if args.output == "table":
            print(watch_row(change), flush=True)
        else:
            as_dict = {"node": change.node, "event": change.event, "resource": change.resource}
            print(_dump(as_dict, args.output, document=True), end="", flush=True)

    return watch_nodes(target.clients(), args.type, args.id, emit, console.error)


_WATCH_WIDTHS = (21, 9, 16, 10, 7, 12, 8)


def watch_row(change: Change) -> str:
    """One change as a row of `kiln node get --watch` (node, event, type, id, version, phase, owner, spec)."""
    r = change.resource
    cells = [printable(change.node), change.event, *(_text(r.get(name)) for name in ("type", "id", "version", "phase"))]
    spec = printable(json.dumps(r.get("spec"), sort_keys=True, separators=(",", ":")))
    return _watch_row([*cells, _text(r.get("owner"))], spec)


def _watch_row(cells: list[str], spec: str) -> str:
    return "  ".join([*(cell.ljust(width) for cell, width in zip(cells, _WATCH_WIDTHS, strict=True)), spec])


def resource_lines(node: str, resources: list[dict[str, Any]]) -> list[str]:
    """One node's resources as a table (node, type, id, version, phase, owner), each row ending in its spec's JSON."""
    columns = ("type", "id", "version", "phase", "owner")
    rows = [["NODE", *(name.upper() for name in columns)]]
    rows += [[printable(node), *(_text(r.get(name)) for name in columns)] for r in resources]
    specs = ["SPEC", *(printable(json.dumps(r.get("spec"), sort_keys=True, separators=(",", ":"))) for r in resources)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=True)), spec])
        for row, spec in zip(rows, specs, strict=True)
    ]


def _apply_config(args: argparse.Namespace, target: Target) -> int:
    """Send FILE to the one node; a config the node refuses is an InputError at FILE (exit 2)."""
    if len(target.endpoints) != 1:
        raise InputError(
            f"kiln node apply-config sends one machine's config (its hostname, addresses, certificate): "
            f"name one node with --nodes, not {len(target.endpoints)}"
        )
    document = read_text_file(Path(args.file), MAX_CONFIG, "machine config").encode()
    mode = "dry_run" if args.dry_run else args.mode
    client = target.clients()[0]
    try:
        report = client.apply_config(document, mode)
    except ApiError as exc:
        if exc.status in REFUSED:
            raise InputError(f"refused by {client.name}: {exc.reason}", Location(args.file)) from None
        raise
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(apply_lines(client.name, report)))
    return 0


_APPLY_HEADS = {"auto": "config applied", "staged": "config staged for the next boot"}


def apply_lines(node: str, report: dict[str, Any]) -> list[str]:
    """A node's report on an applied config: what happened, then one line per section and the node's notes."""
    mode, kept, version = _text(report.get("mode")), _text(report.get("kept")), report.get("config_version")
    head = _APPLY_HEADS.get(mode, "dry run, what auto would do")
    head += f", kept in {kept}" if kept else ""
    head += f"; config/machine version {version}" if isinstance(version, int) and version else ""
    lines = [f"{printable(node)}: {head}"]
    sections = report.get("sections")
    for section in sections if isinstance(sections, list) else []:
        if isinstance(section, dict):
            why = _text(section.get("why"))
            result = _text(section.get("result")) + (f": {why}" if why else "")
            lines.append(f"  {_text(section.get('section')):<20}{result}")
    notes = report.get("notes")
    lines += [f"  note: {_text(note)}" for note in (notes if isinstance(notes, list) else [])]
    return lines


def _logs(args: argparse.Namespace, target: Target) -> int:
    clients = target.clients()
    code = 0
    for client in clients:
        try:
            lines = client.logs(args.service)
        except NodeError as exc:
            console.error(str(exc))
            code = 1
            continue
        if len(clients) > 1:
            print(f"==> {client.name} <==")
        for line in lines:
            print(printable(line))  # a service's output must not drive the terminal
    return code


def _rollback(args: argparse.Namespace, target: Target) -> int:
    console.say_line(f"rolling back {len(target.endpoints)} node(s) one at a time")
    with progress_reporter(rich=console.is_terminal() and not args.json) as report:
        rollout = rolling_rollback(target.clients(), timeout=args.timeout, poll=POLL, report=report)
    return _finish(rollout, json_output=args.json)


def _upgrade(args: argparse.Namespace, target: Target, request: UpgradeRequest) -> int:
    console.say_line(f"upgrading {len(target.endpoints)} node(s) one at a time to {request.describe()}")
    with progress_reporter(rich=console.is_terminal() and not args.json) as report:
        rollout = rolling_upgrade(target.clients(), request, timeout=args.timeout, poll=POLL, report=report)
    return _finish(rollout, json_output=args.json)


def _finish(rollout: Rollout, *, json_output: bool) -> int:
    """Where every node stands (stdout), and the failure that stopped the rollout (stderr)."""
    if json_output:
        print(json.dumps(rollout.as_json(), indent=2))
    else:
        print("\n".join(rollout.lines()))
    failed = rollout.failed
    if failed is not None:
        done = sum(result.done for result in rollout.results)
        word = "upgraded" if rollout.action == "upgrade" else "rolled back"
        console.error(
            f"kiln node {rollout.action}: {failed.node} failed: {failed.reason}; the rollout stopped there"
            f" ({done} of {len(rollout.results)} {word})"
        )
    return 0 if rollout.ok else 1


@contextmanager
def progress_reporter(*, rich: bool) -> Iterator[Reporter]:
    """Rich's status line on a terminal (a line kept for each change of state), plain lines otherwise."""
    if not rich:
        yield _LineReporter()
        return
    from rich.console import Console  # only on a terminal: importing rich costs a noticeable start-up

    stderr = Console(stderr=True)
    last: dict[str, str] = {}
    with stderr.status("starting") as status:

        def report(progress: Progress) -> None:
            text = progress_text(progress)
            if last.get(progress.node) != progress.state:
                stderr.print(printable(text), markup=False, highlight=False)
                last[progress.node] = progress.state
            status.update(printable(text))

        yield report


class _LineReporter:
    """Plain progress lines: one when a node's state changes, then at most one every LINE_EVERY seconds."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[str, float]] = {}

    def __call__(self, progress: Progress) -> None:
        now = time.monotonic()
        state, when = self.last.get(progress.node, ("", 0.0))
        if state == progress.state and now - when < LINE_EVERY:
            return
        self.last[progress.node] = (progress.state, now)
        console.say_line(progress_text(progress))


def progress_text(progress: Progress) -> str:
    """`10.0.0.5:50000: pulling 12.0/80.0 MiB to 0.2.0`."""
    mib = _mib(progress.pulled_bytes, progress.total_bytes) if progress.state == "pulling" else ""
    return f"{progress.node}: {progress.state}{mib}" + (f" {progress.detail}" if progress.detail else "")


def _mib(pulled: Any, total: Any) -> str:
    if not isinstance(pulled, int) or isinstance(pulled, bool) or pulled <= 0:
        return ""
    if isinstance(total, int) and not isinstance(total, bool) and total > 0:
        return f" {pulled / _MiB:.1f}/{total / _MiB:.1f} MiB"
    return f" {pulled / _MiB:.1f} MiB"


def _duration(seconds: float) -> str:
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def _text(value: Any) -> str:
    return printable(str(value)) if value is not None else ""
