"""How `kiln node` shows what machines answer: status blocks, resource tables, watch rows, apply
reports and upgrade progress, as text (every value from a machine made printable) or JSON/YAML."""

from __future__ import annotations

import json
from typing import Any

import yaml

from kiln.core.errors import printable
from kiln.node.rollout import Progress
from kiln.node.watch import Change

_MiB = 1 << 20
_WATCH_WIDTHS = (21, 9, 16, 10, 7, 12, 8)  # NODE, EVENT, TYPE, ID, VERSION, PHASE, OWNER; then SPEC
_APPLY_HEADS = {"auto": "config applied", "staged": "config staged for the next boot"}


def dump(value: Any, output: str, *, document: bool = False) -> str:
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


def watch_row(change: Change) -> str:
    """One change as a row of `kiln node get --watch` (node, event, type, id, version, phase, owner, spec)."""
    r = change.resource
    cells = [printable(change.node), change.event, *(_text(r.get(name)) for name in ("type", "id", "version", "phase"))]
    spec = printable(json.dumps(r.get("spec"), sort_keys=True, separators=(",", ":")))
    return row([*cells, _text(r.get("owner"))], spec)


def row(cells: list[str], spec: str) -> str:
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
