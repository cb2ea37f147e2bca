"""Kernel module signatures (kiln.signing.modules): the appended PKCS#7 format, checked with
OpenSSL's own CMS verifier, determinism, re-signing, and signing a tree without touching the store.
The kernel's acceptance of these signatures is proven in firmware by tests/e2e/test_secureboot.py."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from kiln.core.errors import BuildError, InputError
from kiln.core.nofollow import LinkRefused
from kiln.signing import generate as generate_module
from kiln.signing.generate import generate
from kiln.signing.keyset import KeySet
from kiln.signing.modules import MAGIC, PKEY_ID_PKCS7, TRAILER, ModuleSigner, signature_of, unsigned
from tests.unit.hostile_tree import Canary

MODULE = b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 40


def placeholder_lists(keys: KeySet) -> None:
    """Stands in for efitools' signature lists, which module signing never reads."""
    for path, _ in generate_module.files(keys):
        if path.suffix in (".esl", ".auth"):
            path.write_bytes(b"placeholder")


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeySet]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generate_module, "write_signature_lists", placeholder_lists)
        yield generate(tmp_path_factory.mktemp("k") / "keys", common_name="Modules")


@pytest.fixture(scope="module")
def signer(keys: KeySet) -> ModuleSigner:
    return ModuleSigner.from_keys(keys)


def test_a_signed_module_is_the_module_a_pkcs7_signature_the_trailer_and_the_magic(signer: ModuleSigner) -> None:
    signed = signer.sign(MODULE)
    assert signed.startswith(MODULE) and signed.endswith(MAGIC)
    fields = TRAILER.unpack_from(signed, len(signed) - len(MAGIC) - TRAILER.size)
    signature = signature_of(signed)
    assert signature is not None
    assert fields == (0, 0, PKEY_ID_PKCS7, 0, 0, len(signature))
    assert len(signed) == len(MODULE) + len(signature) + TRAILER.size + len(MAGIC)
    assert unsigned(signed) == MODULE


def test_openssl_verifies_the_signature_against_the_module_certificate(
    signer: ModuleSigner, keys: KeySet, tmp_path: Path
) -> None:
    signed = signer.sign(MODULE)
    (tmp_path / "sig.der").write_bytes(signature_of(signed) or b"")
    (tmp_path / "module").write_bytes(MODULE)
    argv = ["openssl", "smime", "-verify", "-binary", "-inform", "DER", "-in", str(tmp_path / "sig.der")]
    argv += [
        "-content",
        str(tmp_path / "module"),
        "-certfile",
        str(keys.cert("module")),
        "-nointern",
        "-noverify",
        "-out",
        os.devnull,
    ]
    good = subprocess.run(argv, capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    (tmp_path / "module").write_bytes(MODULE[:-1] + b"\0")
    assert subprocess.run(argv, capture_output=True).returncode != 0, "a changed module still verified"
    # what the kernel's PKCS#7 parser accepts for RSA: rsaEncryption with SHA-256, no attributes, no certificates
    parsed = subprocess.run(
        ["openssl", "asn1parse", "-inform", "DER", "-in", str(tmp_path / "sig.der")], capture_output=True, text=True
    ).stdout
    assert ":rsaEncryption" in parsed and ":sha256" in parsed
    assert "signingTime" not in parsed and "messageDigest" not in parsed and "X509v3" not in parsed


def test_same_module_same_key_same_bytes_and_resigning_replaces(signer: ModuleSigner) -> None:
    once = signer.sign(MODULE)
    assert signer.sign(MODULE) == once
    assert signer.sign(once) == once, "signing a signed module must replace its signature, not stack one"
    assert signature_of(MODULE) is None and unsigned(MODULE) is MODULE


def test_a_malformed_trailer_is_refused(signer: ModuleSigner) -> None:
    with pytest.raises(ValueError, match="malformed"):
        unsigned(b"x" * 40 + TRAILER.pack(0, 0, PKEY_ID_PKCS7, 0, 0, 10_000) + MAGIC)
    with pytest.raises(ValueError, match="truncated"):
        unsigned(MAGIC)


def test_sign_tree_signs_modules_in_new_inodes_and_keeps_modes_and_times(signer: ModuleSigner, tmp_path: Path) -> None:
    store, tree = tmp_path / "store", tmp_path / "tree"
    (store / "kernel").mkdir(parents=True)
    (store / "kernel/virtio.ko").write_bytes(MODULE)
    drivers = tree / "usr/lib/modules/6.1/kernel"
    drivers.mkdir(parents=True)
    os.link(store / "kernel/virtio.ko", drivers / "virtio.ko")  # as a tree hard-linked from the store would be
    os.chmod(drivers / "virtio.ko", 0o640)
    os.utime(drivers / "virtio.ko", ns=(1_000_000_000, 2_000_000_000))
    (drivers / "modules.dep").write_text("kernel/virtio.ko:\n")
    (tree / "usr/local").mkdir(parents=True)
    (tree / "usr/local/alias.ko").symlink_to("../lib/modules/6.1/kernel/virtio.ko")  # outside modules: left alone

    assert signer.sign_tree(tree) == 1
    assert (drivers / "virtio.ko").read_bytes() == signer.sign(MODULE)
    assert (store / "kernel/virtio.ko").read_bytes() == MODULE, "the store's file was changed"
    info = (drivers / "virtio.ko").stat()
    assert (info.st_mode & 0o777, info.st_mtime_ns) == (0o640, 2_000_000_000)
    assert (drivers / "modules.dep").read_text() == "kernel/virtio.ko:\n"
    assert (tree / "usr/local/alias.ko").is_symlink()
    assert not list(drivers.glob(".*")), "a staging file was left behind"


def test_sign_tree_refuses_compressed_and_malformed_modules(signer: ModuleSigner, tmp_path: Path) -> None:
    (tmp_path / "a.ko.xz").write_bytes(b"\xfd7zXZ")
    with pytest.raises(BuildError, match=r"/a.ko.xz: a compressed module cannot be signed"):
        signer.sign_tree(tmp_path)
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    (tmp_path / "b.ko").write_bytes(MAGIC)
    with pytest.raises(BuildError, match=r"/b.ko: truncated module signature"):
        signer.sign_tree(tmp_path)


def test_a_module_key_that_is_not_rsa_is_refused(keys: KeySet, tmp_path: Path) -> None:
    other = tmp_path / "keys"
    shutil.copytree(keys.root, other)
    pem = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (other / "module.key").write_bytes(pem)
    with pytest.raises(InputError, match="the module key must be RSA"):
        ModuleSigner.from_keys(KeySet(other))


def test_the_fingerprint_names_the_certificate(signer: ModuleSigner, keys: KeySet) -> None:
    der = keys.module_der.read_bytes()
    assert der == signer.cert.public_bytes(serialization.Encoding.DER)
    assert signer.fingerprint == hashlib.sha256(der).hexdigest()


def test_a_planted_staging_link_never_receives_the_signed_module(
    signer: ModuleSigner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old staging name `.<name>.signed`, and the helper's own one, planted as links to a host file beside a
    module outside /usr/lib/modules (under it, any link is refused: the next test)."""
    canary = Canary(tmp_path / "host")
    drivers = tmp_path / "tree/usr/local/lib/drivers"
    drivers.mkdir(parents=True)
    (drivers / "foo.ko").write_bytes(MODULE)
    (drivers / ".foo.ko.signed").symlink_to(canary.file)
    names = iter(["planted", "fresh"])
    monkeypatch.setattr(secrets, "token_hex", lambda _n: next(names))
    (drivers / ".foo.ko.kiln-planted").symlink_to(canary.file)
    assert signer.sign_tree(tmp_path / "tree") == 1
    assert (drivers / "foo.ko").read_bytes() == signer.sign(MODULE)
    canary.check()


@pytest.mark.parametrize(
    ("planted", "named"),
    [
        ("usr/lib/modules/6.1/kernel/evil.ko", "/usr/lib/modules/6.1/kernel/evil.ko"),  # a module that is a link
        ("usr/lib/modules/6.1/extra", "/usr/lib/modules/6.1/extra"),  # a directory of modules that is a link
        ("usr/lib/modules/6.2", "/usr/lib/modules/6.2"),
        ("usr/lib/modules/6.1/kernel/.real.ko.signed", "/usr/lib/modules/6.1/kernel/.real.ko.signed"),
    ],
)
def test_a_link_under_the_modules_is_refused_by_name(
    signer: ModuleSigner, tmp_path: Path, planted: str, named: str
) -> None:
    canary = Canary(tmp_path / "host")
    (canary.dir / "host.ko").write_bytes(MODULE)
    canary.snapshot()
    tree = tmp_path / "tree"
    (tree / "usr/lib/modules/6.1/kernel").mkdir(parents=True)
    (tree / "usr/lib/modules/6.1/kernel/real.ko").write_bytes(MODULE)
    (tree / planted).symlink_to(canary.dir / "host.ko" if planted.endswith(".ko") else canary.dir)
    with pytest.raises(LinkRefused, match=f"module signing: {named} is a symbolic link"):
        signer.sign_tree(tree)
    canary.check()


def test_a_link_to_the_modules_directory_itself_is_refused(signer: ModuleSigner, tmp_path: Path) -> None:
    host = Canary(tmp_path / "host")
    (tmp_path / "tree/usr/lib").mkdir(parents=True)
    (tmp_path / "tree/usr/lib/modules").symlink_to(host.dir)
    with pytest.raises(LinkRefused, match="/usr/lib/modules is a symbolic link"):
        signer.sign_tree(tmp_path / "tree")
    host.check()
