"""The node client's config file (kiln.node.config): contexts, flags over the file, and file:line errors."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.core.errors import InputError, InputErrors, KilnError
from kiln.node.client import DEFAULT_PORT, Endpoint, parse_endpoint
from kiln.node.config import ENV, Flags, resolve
from tests.conftest import Result
from tests.unit.node_certs import Certs, make_certs

Kiln = Callable[..., Result]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def write(tmp_path: Path, certs: Certs) -> Callable[[str], Path]:
    """Write nodeconfig.yaml beside copies of the CA and the client's certificate and key."""
    for name in ("ca.crt", "client.crt", "client.key", "other-ca.key"):
        (tmp_path / name).write_bytes((certs.directory / name).read_bytes())

    def write(text: str) -> Path:
        path = tmp_path / "nodeconfig.yaml"
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return path

    return write


def problem(path: Path, flags: Flags | None = None) -> str:
    with pytest.raises(KilnError) as caught:
        resolve(flags or Flags(config=str(path)), environ={})
    assert isinstance(caught.value, InputError | InputErrors)
    assert caught.value.exit_code == 2
    return str(caught.value)


GOOD = """
    context: prod
    contexts:
      prod:
        endpoints: [10.0.0.5, "10.0.0.6:50001", node-3.example.com, "[fd00::7]:50002"]
        ca: ca.crt
        cert: client.crt
        key: {key}
      lab:
        endpoints: [192.168.1.2]
        ca: ca.crt
        cert: client.crt
        key: client.key
"""


def test_a_good_config_gives_its_context_s_endpoints_in_order(write: Callable[[str], Path], certs: Certs) -> None:
    key = "|\n" + textwrap.indent(certs.key("client").read_text(), " " * 10)  # inline PEM works as well as a file
    path = write(GOOD.replace("{key}", key))
    target = resolve(Flags(config=str(path)), environ={})
    assert target.context == "prod"
    assert [str(e) for e in target.endpoints] == [
        "10.0.0.5:50000",
        "10.0.0.6:50001",
        "node-3.example.com:50000",
        "[fd00::7]:50002",
    ]
    assert target.tls.context_for(Endpoint("10.0.0.5")).check_hostname is False  # an IP: the chain alone
    assert target.tls.context_for(Endpoint("node-3.example.com")).check_hostname is True
    lab = resolve(Flags(context="lab", nodes="a,b:7"), environ={ENV: str(path)})
    assert lab.context == "lab" and lab.endpoints == (Endpoint("a"), Endpoint("b", 7))


def test_flags_alone_need_no_file(certs: Certs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/kiln/nodeconfig.yaml
    flags = Flags(
        nodes="127.0.0.1", ca=str(certs.crt("ca")), cert=str(certs.crt("client")), key=str(certs.key("client"))
    )
    assert resolve(flags, environ={}).endpoints == (Endpoint("127.0.0.1", DEFAULT_PORT),)
    with pytest.raises(InputError, match="no nodes: pass --nodes"):
        resolve(Flags(ca=flags.ca, cert=flags.cert, key=flags.key), environ={})


def test_a_context_that_is_not_there_is_named_at_its_line(write: Callable[[str], Path]) -> None:
    path = write(GOOD.replace("context: prod", "context: prd").replace("{key}", "client.key"))
    assert problem(path) == f"{path}:1: context 'prd' is not one of the contexts (lab, prod) (did you mean 'prod'?)"
    flagged = problem(path, Flags(config=str(path), context="staging"))
    assert flagged == f"{path}:2: --context 'staging' is not one of the contexts (lab, prod)"


def test_without_a_chosen_context_several_are_ambiguous(write: Callable[[str], Path]) -> None:
    path = write(GOOD.replace("    context: prod\n", "").replace("{key}", "client.key"))
    assert problem(path) == f"{path}:1: no context chosen: set 'context' or pass --context (lab, prod)"


def test_bad_yaml_is_reported_at_its_line(write: Callable[[str], Path]) -> None:
    path = write("context: prod\ncontexts:\n  prod: [unclosed\n")
    assert problem(path).startswith(f"{path}:4: YAML syntax:")


def test_unknown_keys_and_wrong_types_are_all_reported_at_their_lines(write: Callable[[str], Path]) -> None:
    path = write(
        """
        contexts:
          prod:
            endpoint: [10.0.0.5]
            ca: ca.crt
            cert: 5
            key: client.key
        """
    )
    assert problem(path).splitlines() == [
        f"{path}:3: unknown key 'endpoint' in contexts.prod (did you mean 'endpoints'?)",
        f"{path}:5: cert must be a string, not a number (quote it)",
    ]


def test_a_bad_endpoint_is_reported_at_its_line(write: Callable[[str], Path]) -> None:
    path = write(GOOD.replace("node-3.example.com", "'node 3:99999'").replace("{key}", "client.key"))
    assert problem(path) == f"{path}:4: endpoints[2]: 'node 3:99999' is not host[:port]"
    twice = write(GOOD.replace("10.0.0.6:50001", "10.0.0.5:50000").replace("{key}", "client.key"))
    assert problem(twice) == f"{twice}:4: endpoints[1]: 10.0.0.5:50000 is listed twice"


def test_missing_or_mismatched_certificates_are_reported_where_the_config_names_them(
    write: Callable[[str], Path],
) -> None:
    missing = write(GOOD.replace("ca: ca.crt", "ca: nowhere/ca.crt", 1).replace("{key}", "client.key"))
    assert problem(missing) == (
        f"{missing}:5: ca: cannot read ca file: No such file or directory: {missing.parent}/nowhere/ca.crt"
    )
    not_a_key = write(GOOD.replace("{key}", "ca.crt"))
    assert problem(not_a_key) == f"{not_a_key}:7: key is not a PEM private key (no 'PRIVATE KEY-----' line)"
    mismatch = write(GOOD.replace("{key}", "other-ca.key"))
    assert problem(mismatch) == f"{mismatch}:6: cert and key do not load: the key does not belong to the certificate"


def test_a_named_config_must_exist(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(InputError) as caught:
        resolve(Flags(), environ={ENV: str(path)})
    assert str(caught.value) == f"{path}:1: cannot read node config: No such file or directory"


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [("h", Endpoint("h")), ("h:1", Endpoint("h", 1)), ("::1", Endpoint("::1")), ("[::1]:9", Endpoint("::1", 9))],
)
def test_endpoints_parse(text: str, endpoint: Endpoint) -> None:
    assert parse_endpoint(text) == endpoint


@pytest.mark.parametrize("text", ["", "h:", "h:0", "h:x", "[::1", "[::1]x", "a/b", "h:70000"])
def test_bad_endpoints_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_endpoint(text)


def test_the_cli_prints_a_bad_config_as_file_line_and_exits_2(write: Callable[[str], Path], kiln: Kiln) -> None:
    write("contexts: {}\n")
    result = kiln("node", "status", "--config", "nodeconfig.yaml")
    assert result.code == 2
    assert result.err.startswith("nodeconfig.yaml:1: contexts")


def test_the_cli_checks_upgrade_flags_before_anything_else(kiln: Kiln) -> None:
    result = kiln("node", "upgrade", "--channel", "beta", "--nodes", "h")
    assert result.code == 2 and "--channel and --repository go together" in result.err
    result = kiln("node", "upgrade", "--image", "r/k:1", "--digest", "sha256:00", "--nodes", "h")
    assert result.code == 2 and "--digest goes with --url" in result.err
    result = kiln("node", "rollback")
    assert result.code == 2 and "name them with --nodes" in result.err
