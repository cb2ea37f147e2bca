"""`kiln release push --sign` and `kiln verify IMAGE` against a real registry (Debian's docker-registry).

The pushed manifest gets a `sha256-<hex>.sig` tag holding cosign's simple-signing signature of its
digest by the image release key; verify accepts it with that key, and refuses another key, an image
that was never signed, a signature moved onto another image's tag and a tampered payload. The first
Kiln format (`--signature-format kiln-v1`, Ed25519) still pushes and verifies, with a note.
(test_release_push_cosign.py has skopeo check the same.)
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiln.core.registry import Client, Ref
from kiln.signing.generate import generate
from kiln.signing.image_signature import LAYER_TYPE, SIGNATURE_KEY, load_private_key, sign_digest, signature_tag
from kiln.signing.keyset import RELEASE_IMAGE, KeySet
from tests.integration import services
from tests.integration.test_release_push import KILN, REPO, ROOT, small_installer

pytestmark = pytest.mark.integration


@pytest.fixture
def registry() -> Iterator[tuple[str, Path]]:
    yield from services.registry()


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return small_installer(tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[KeySet, KeySet]:
    base = tmp_path_factory.mktemp("keys")
    return generate(base / "mine", common_name="Kiln test"), generate(base / "other", common_name="Other")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KILN, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def push(layout_dir: Path, host: str, *extra: str) -> dict[str, Any]:
    result = run("release", "push", str(layout_dir), "--to", f"{host}/{REPO}", "--channel", "stable", "--json", *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(json.loads(result.stdout))


def test_signed_push_verifies_with_its_key_only(
    layout: tuple[Path, Path], registry: tuple[str, Path], keys: tuple[KeySet, KeySet]
) -> None:
    mine, other = keys
    host, _ = registry
    pushed = push(layout[0], host, "--sign", str(mine.root))
    digest = pushed["digest"]
    assert pushed["signatures"] == {digest: signature_tag(digest)}
    image = f"{host}/{REPO}:{pushed['tag']}"
    good = run("verify", image, "--key", str(mine.release_image_public))
    assert good.returncode == 0 and f"{digest} signed by" in good.stdout, good.stdout + good.stderr
    assert "first Kiln signature format" not in good.stdout
    foreign = run("verify", image, "--key", str(other.release_image_public))
    assert foreign.returncode == 1 and "is not by a trusted key" in foreign.stderr, foreign.stderr
    ed25519 = run("verify", image, "--key", str(mine.release_public))  # the checksums key did not sign it
    assert ed25519.returncode == 1 and "is not by a trusted key" in ed25519.stderr, ed25519.stderr
    again = push(layout[0], host, "--sign", str(mine.root))  # deterministic: the same signature manifest
    assert again["signatures"] == pushed["signatures"]


def test_the_first_kiln_format_still_pushes_and_verifies_with_a_note(
    layout: tuple[Path, Path], registry: tuple[str, Path], keys: tuple[KeySet, KeySet]
) -> None:
    mine, _ = keys
    host, _ = registry
    pushed = push(layout[0], host, "--sign", str(mine.root), "--signature-format", "kiln-v1")
    image = f"{host}/{REPO}@{pushed['digest']}"
    good = run("verify", image, "--key", str(mine.release_public))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "first Kiln signature format, which machined refuses from Kiln 0.3.0" in good.stdout, good.stdout
    assert "kiln release push --sign KEYDIR" in good.stdout
    image_key = run("verify", image, "--key", str(mine.release_image_public))
    assert image_key.returncode == 1 and "only an Ed25519 key (release.pub) checks" in image_key.stderr
    unsigned = run("release", "push", str(layout[0]), "--to", f"{host}/{REPO}", "--channel", "stable",
                   "--signature-format", "kiln-v1")  # fmt: skip
    assert unsigned.returncode == 2 and "--signature-format applies with --sign KEYDIR" in unsigned.stderr


def test_unsigned_moved_and_tampered_signatures_are_refused(
    layout: tuple[Path, Path], registry: tuple[str, Path], keys: tuple[KeySet, KeySet]
) -> None:
    mine, _ = keys
    host, _ = registry
    pushed = push(layout[0], host)
    digest = pushed["digest"]
    image = f"{host}/{REPO}@{digest}"
    unsigned = run("verify", image, "--key", str(mine.release_image_public))
    assert unsigned.returncode == 1 and f"no signature for {digest}" in unsigned.stderr, unsigned.stderr
    client = Client(Ref.parse(f"{host}/{REPO}"))
    key = load_private_key(mine.key(RELEASE_IMAGE))
    repository = f"{host}/{REPO}"
    # a good signature of another digest, put where this image's signature belongs
    elsewhere = sign_digest("sha256:" + "0" * 64, repository, key)
    for blob in elsewhere.blobs:
        upload(client, blob)
    client.put_manifest(signature_tag(digest), elsewhere.manifest)
    moved = run("verify", image, "--key", str(mine.release_image_public))
    assert moved.returncode == 1 and f"names sha256:{'0' * 64}, not the image {digest}" in moved.stderr
    # this image's signature with its payload swapped for another (same key, payload not what was signed)
    signed = sign_digest(digest, repository, key)
    genuine = json.loads(signed.manifest)
    forged = sign_digest(digest, "elsewhere.example/other", key).payload
    for blob in (*signed.blobs, forged):
        upload(client, blob)
    genuine["layers"][0].update(digest="sha256:" + hashlib.sha256(forged).hexdigest(), size=len(forged))
    assert genuine["layers"][0]["mediaType"] == LAYER_TYPE and SIGNATURE_KEY in genuine["layers"][0]["annotations"]
    client.put_manifest(signature_tag(digest), json.dumps(genuine).encode())
    tampered = run("verify", image, "--key", str(mine.release_image_public))
    assert tampered.returncode == 1 and "is not by a trusted key" in tampered.stderr, tampered.stderr


def upload(client: Client, blob: bytes) -> None:
    client.upload_blob(io.BytesIO(blob), "sha256:" + hashlib.sha256(blob).hexdigest(), len(blob))
