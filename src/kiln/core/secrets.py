"""What looks like a secret in a document a user wrote, and the document with those parts redacted.

One rule for every place that publishes a user's document: the image factory refuses a schematic
that holds a secret (kiln.factory.guard), and an image's provenance shows profiles, schematics and
variables only after `redact` (kiln.image.provenance). A secret is found by its text (a PEM private
key, an access token in a format its issuer publishes, a URL with a password, `NAME=value` with a
secret's name) or by the name of the field holding it (`password`, `api_key`, `token`, machined's
`api.key`, ...); a name that says where a secret is (`TOKEN_FILE`, `key_path`) is not one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----")
# Tokens in formats their issuers publish: AWS access key IDs, GitHub, GitLab, Slack, Google API keys, Stripe.
TOKEN_FORMATS = re.compile(
    r"\b(AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}|[sr]k_live_[0-9A-Za-z]{16,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"  # and signed JWTs
)
URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@", re.IGNORECASE)  # scheme://user:password@
# Field names (machine_config keys, service env names, NAME=value in arguments) that hold secrets.
SECRET_NAME = re.compile(
    r"(?:^|[_.-])(?:password|passwd|passphrase|secret|token|api[_-]?key|apikey|private[_-]?key|access[_-]?key"
    r"|secret[_-]?key|client[_-]?secret|credentials?|auth[_-]?key)(?:$|[_.-])",
    re.IGNORECASE,
)
NAMES_A_PLACE = re.compile(r"[_.-](?:file|path|dir|url)$", re.IGNORECASE)
ASSIGNMENT = re.compile(r"^-{0,2}(?P<name>[A-Za-z0-9_.-]+)=(?P<value>.+)$")
KEY_FIELDS = {("api", "key")}  # paths that hold a private key whatever its text (machined's API key)
REDACTED = "[redacted]"

Path_ = tuple[str, ...]
Scope = Callable[[Path_], bool]  # whether a field at this path is judged by its name


def everywhere(path: Path_) -> bool:
    """Judge every field by its name (a document that is all user configuration)."""
    return True


def findings(
    value: Any, in_scope: Scope = everywhere, path: Path_ = (), *, top: str = "document"
) -> Iterator[tuple[str, str]]:
    """(dotted path, what) for each secret in `value`: a secret-named field (where `in_scope` says
    names count) with a non-empty value, or a string whose text is a secret (`top` names the root)."""
    where = ".".join(path) or top
    if isinstance(value, dict):
        for key, item in value.items():
            inner = (*path, str(key))
            if in_scope(inner) and item not in (None, "", [], {}) and secret_field(inner):
                yield ".".join(inner), f"a field named {key!r} holds a secret"
                continue
            yield from findings(item, in_scope, inner, top=top)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from findings(item, in_scope, (*path, str(index)), top=top)
    elif isinstance(value, str):
        what = secret_text(value)
        if what:
            yield where, what


def redact(value: Any, in_scope: Scope = everywhere, path: Path_ = ()) -> Any:
    """A copy of `value` with every secret `findings` would report replaced by REDACTED: the whole
    value of a secret-named field, the whole string whose text holds one."""
    if isinstance(value, dict):
        copy: dict[str, Any] = {}
        for key, item in value.items():
            inner = (*path, str(key))
            secret = in_scope(inner) and item not in (None, "", [], {}) and secret_field(inner)
            copy[key] = REDACTED if secret else redact(item, in_scope, inner)
        return copy
    if isinstance(value, list):
        return [redact(item, in_scope, (*path, str(index))) for index, item in enumerate(value)]
    if isinstance(value, str) and secret_text(value):
        return REDACTED
    return value


def secret_field(path: Path_) -> bool:
    """A field whose path or name says it holds a secret."""
    return path[-2:] in KEY_FIELDS or secret_name(path[-1])


_TEXT_SECRETS = (
    (PRIVATE_KEY, "holds a PEM private key"),
    (TOKEN_FORMATS, "holds an access token"),
    (URL_PASSWORD, "holds a URL with a password"),
)


def secret_text(text: str) -> str:
    """What secret `text` holds, in a few words; empty when none."""
    for pattern, what in _TEXT_SECRETS:
        if pattern.search(text):
            return what
    assigned = ASSIGNMENT.match(text)
    if assigned and secret_name(assigned["name"]):
        return f"sets {assigned['name']!r}, a secret"
    return ""


def secret_name(name: str) -> bool:
    """A name that says it holds a secret (`API_KEY`, `db_password`), not where one is (`TOKEN_FILE`)."""
    return bool(SECRET_NAME.search(name)) and not NAMES_A_PLACE.search(name)
