"""`kiln release push --sign` and `kiln verify IMAGE` against a real registry (Debian's docker-registry).

The pushed manifest gets a `sha256-<hex>.sig` tag holding the Ed25519 signature of its digest;
verify accepts it with the release key, and refuses another key, an image that was never signed,
a signature moved onto another image's tag and a tampered payload.
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
from kiln.signing.image_signature import LAYER_TYPE, sign_digest, signature_tag
from kiln.signing.keyset import RELEASE, KeySet
from kiln.signing.release import load_private_key
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
    good = run("verify", image, "--key", str(mine.release_public))
    assert good.returncode == 0 and f"{digest} signed by" in good.stdout, good.stdout + good.stderr
    foreign = run("verify", image, "--key", str(other.release_public))
    assert foreign.returncode == 1 and "is not by a trusted key" in foreign.stderr, foreign.stderr


def test_unsigned_moved_and_tampered_signatures_are_refused(
    layout: tuple[Path, Path], registry: tuple[str, Path], keys: tuple[KeySet, KeySet]
) -> None:
    mine, _ = keys
    host, _ = registry
    pushed = push(layout[0], host)
    digest = pushed["digest"]
    image = f"{host}/{REPO}@{digest}"
    unsigned = run("verify", image, "--key", str(mine.release_public))
    assert unsigned.returncode == 1 and f"no signature for {digest}" in unsigned.stderr, unsigned.stderr
    client = Client(Ref.parse(f"{host}/{REPO}"))
    key = load_private_key(mine.key(RELEASE))
    # a good signature of another digest, put where this image's signature belongs
    elsewhere = sign_digest("sha256:" + "0" * 64, key)
    upload(client, elsewhere.payload)
    upload(client, b"{}")
    client.put_manifest(signature_tag(digest), elsewhere.manifest)
    moved = run("verify", image, "--key", str(mine.release_public))
    assert moved.returncode == 1 and f"names sha256:{'0' * 64}, not the image {digest}" in moved.stderr
    # this image's signature with its payload swapped for another (same key, payload not what was signed)
    genuine = json.loads(sign_digest(digest, key).manifest)
    forged = b'{"critical":{"image":{"manifest-digest":"%s"},"type":"other"}}' % digest.encode()
    upload(client, forged)
    genuine["layers"][0].update(digest="sha256:" + hashlib.sha256(forged).hexdigest(), size=len(forged))
    assert genuine["layers"][0]["mediaType"] == LAYER_TYPE
    client.put_manifest(signature_tag(digest), json.dumps(genuine).encode())
    tampered = run("verify", image, "--key", str(mine.release_public))
    assert tampered.returncode == 1 and "is not by a trusted key" in tampered.stderr, tampered.stderr


def upload(client: Client, blob: bytes) -> None:
    client.upload_blob(io.BytesIO(blob), "sha256:" + hashlib.sha256(blob).hexdigest(), len(blob))
