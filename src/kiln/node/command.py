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

from kiln.core import console
from kiln.core.errors import InputError, Location, printable
from kiln.core.verb import Context
from kiln.core.yamlfile import read_text_file
from kiln.node.client import ApiError, NodeClient, NodeError, UpgradeRequest
from kiln.node.config import Flags, Target, resolve
from kiln.node.rollout import Progress, Reporter, Rollout, rolling_rollback, rolling_upgrade
from kiln.node.text import apply_lines, dump, progress_text, resource_lines, row, status_lines, watch_row
from kiln.node.watch import Change, watch_nodes

DEFAULT_TIMEOUT = 900.0
CHANNELS = ("alpha", "beta", "stable")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
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
    get.add_argument(
        "type",
        nargs="?",
        default="",
        help="only this resource type (network/status), or a short name: addresses, links, services, bootstate, ...",
    )
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
        print(dump(answers, output), end="")
    for answer in answers:
        if "error" in answer:
            console.error(f"{answer['node']}: {answer['error']}")
        elif output == "table":
            print("\n".join(lines(answer["node"], answer[key])))
    return 1 if any("error" in answer for answer in answers) else 0


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
        print(row(["NODE", "EVENT", "TYPE", "ID", "VERSION", "PHASE", "OWNER"], "SPEC"), flush=True)

    def emit(change: Change) -> None:
        if args.output == "table":
            print(watch_row(change), flush=True)
        else:
            as_dict = {"node": change.node, "event": change.event, "resource": change.resource}
            print(dump(as_dict, args.output, document=True), end="", flush=True)

    return watch_nodes(target.clients(), args.type, args.id, emit, console.error)


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
