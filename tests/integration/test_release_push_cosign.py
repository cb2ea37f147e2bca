"""`kiln release push --sign` checked by real clients: skopeo, with a sigstoreSigned policy, copies a
signed installer image from a real registry (Debian's docker-registry), and `cosign verify --key`
accepts it; both refuse it once the signature is another key's, or once the tag names a changed
manifest (unsigned, or carrying the old manifest's signature). `kiln verify` says the same each time.

Debian 12's skopeo (1.9.3) has sigstore verification compiled out (a Debian patch: "Debian-local
change: sigstore disabled"), so it can verify no sigstore signature at all, and Debian 12 has no
cosign; Debian 13's skopeo (1.18) and cosign (2.5) do both. scripts/setup-host.sh installs those
in VERIFIERS_HOME; the test takes $KILN_SKOPEO and $KILN_COSIGN, then those, then the ones on PATH,
and proves skopeo can verify before it believes a refusal.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kiln.core.registry import Client, Ref
from kiln.image.provenance import Part
from kiln.signing.image_attestation import attest_digest
from kiln.signing.image_signature import put_artifact, sign_digest, signature_tag
from kiln.signing.keyset import RELEASE_IMAGE, KeySet
from kiln.signing.release import PROVENANCE
from tests.integration import services
from tests.integration.test_release_push import KILN, REPO, ROOT, small_installer
from tests.unit.test_provenance import output_directory, part, written

__all__ = ["part"]  # the provenance fixture the attestation test takes

pytestmark = pytest.mark.integration

VERIFIERS_HOME = Path("/usr/local/lib/kiln/debian13")  # where scripts/setup-host.sh puts Debian 13's skopeo and cosign
DISABLED = "Debian-local change: sigstore disabled"


@pytest.fixture
def registry() -> Iterator[tuple[str, Path]]:
    yield from services.registry()


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return small_installer(tmp_path_factory.mktemp("release"))


def image_keys(root: Path) -> tuple[KeySet, ec.EllipticCurvePrivateKey]:
    """A key directory holding only the image release key: all `release push --sign` reads."""
    root.mkdir(mode=0o700)
    keys, key = KeySet(root), ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    keys.key(RELEASE_IMAGE).write_bytes(private)
    keys.key(RELEASE_IMAGE).chmod(0o600)
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    keys.release_image_public.write_bytes(public)
    return keys, key


def tool(name: str) -> list[str]:
    """The skopeo or cosign to run: $KILN_SKOPEO / $KILN_COSIGN, Debian 13's from setup-host.sh, or PATH's."""
    for candidate in (os.environ.get(f"KILN_{name.upper()}"), str(VERIFIERS_HOME / name), shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            return [candidate]
    services.unavailable(name, "scripts/setup-host.sh installs it (Debian 13's, in /usr/local/lib/kiln/debian13)")
    raise AssertionError("unreachable")


class Skopeo:
    """skopeo copy under a policy that trusts one public key for the registry's repository."""

    def __init__(self, work: Path, host: str, public_key: Path) -> None:
        self.work, self.host = work, host
        self.command = tool("skopeo")
        policy = {
            "default": [{"type": "reject"}],
            "transports": {
                "docker": {
                    f"{host}/{REPO}": [
                        {
                            "type": "sigstoreSigned",
                            "keyPath": str(public_key),
                            # cosign's payloads name the repository, not a tag
                            "signedIdentity": {"type": "matchRepository"},
                        }
                    ]
                }
            },
        }
        (work / "policy.json").write_text(json.dumps(policy, indent=2))
        (work / "registries.d").mkdir()
        (work / "registries.d/kiln.yaml").write_text(f"docker:\n  {host}:\n    use-sigstore-attachments: true\n")

    def copy(self, reference: str) -> subprocess.CompletedProcess[str]:
        out = self.work / "copied"
        shutil.rmtree(out, ignore_errors=True)
        args = ["--policy", str(self.work / "policy.json"), "--registries.d", str(self.work / "registries.d")]
        return subprocess.run(
            [*self.command, *args, "copy", "--src-tls-verify=false", f"docker://{self.host}/{REPO}:{reference}",
             f"dir:{out}"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip


def cosign_verify(work: Path, public_key: Path, image: str) -> subprocess.CompletedProcess[str]:
    """`cosign verify --key`: no transparency log (Kiln writes none), plain HTTP, its cache in `work`."""
    return subprocess.run(
        [*tool("cosign"), "verify", "--key", str(public_key), "--insecure-ignore-tlog", "--allow-insecure-registry",
         "--allow-http-registry", image],
        capture_output=True, text=True, timeout=300, check=False, env={**os.environ, "HOME": str(work)},
    )  # fmt: skip


def kiln(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KILN, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def push(layout_dir: Path, host: str, *extra: str) -> dict[str, Any]:
    result = kiln("release", "push", str(layout_dir), "--to", f"{host}/{REPO}", "--channel", "stable", "--json", *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(json.loads(result.stdout))


def refused(result: subprocess.CompletedProcess[str], *reasons: str) -> None:
    """skopeo or cosign refused the image for one of `reasons` (its message, printed for the record)."""
    print(f"exit {result.returncode}: {result.stderr.strip()}")
    assert result.returncode != 0, result.stdout + result.stderr
    assert any(reason in result.stderr for reason in reasons), result.stderr


def test_skopeo_and_cosign_accept_a_signed_release_and_refuse_a_foreign_or_moved_signature(
    layout: tuple[Path, Path], registry: tuple[str, Path], tmp_path: Path
) -> None:
    host, _ = registry
    (mine, _), (_, other) = image_keys(tmp_path / "mine"), image_keys(tmp_path / "other")
    pushed = push(layout[0], host, "--sign", str(mine.root))
    digest, tag = pushed["digest"], pushed["tag"]
    image, key = f"{host}/{REPO}:{tag}", mine.release_image_public
    skopeo = Skopeo(tmp_path, host, key)

    accepted = skopeo.copy(tag)
    print(f"skopeo exit {accepted.returncode}: {accepted.stdout.strip()} {accepted.stderr.strip()}")
    if accepted.returncode != 0 and DISABLED in accepted.stderr:
        services.unavailable(
            f"a skopeo that verifies sigstore signatures ({skopeo.command[0]} says {DISABLED!r})",
            f"Debian 12's has it compiled out; scripts/setup-host.sh puts Debian 13's in {VERIFIERS_HOME}",
        )
    assert accepted.returncode == 0 and "Storing signatures" in accepted.stdout, accepted.stdout + accepted.stderr
    cosign = cosign_verify(tmp_path, key, image)
    print(f"cosign exit {cosign.returncode}: {cosign.stdout.strip()}")
    assert cosign.returncode == 0 and f'"docker-manifest-digest":"{digest}"' in cosign.stdout, cosign.stderr
    assert kiln("verify", image, "--key", str(key)).returncode == 0

    # (a) the signature swapped for one by another key, over the same payload
    client = Client(Ref.parse(f"{host}/{REPO}"))
    forged = sign_digest(digest, f"{host}/{REPO}", other)
    put_artifact(client, signature_tag(digest), forged.blobs, forged.manifest)
    refused(skopeo.copy(tag), "Source image rejected: cryptographic signature verification failed")
    refused(cosign_verify(tmp_path, key, image), "no matching signatures")
    assert "is not by a trusted key" in kiln("verify", image, "--key", str(key)).stderr

    # (b) the tag moved to a changed manifest: unsigned, then carrying the first manifest's good signature
    push(layout[0], host, "--sign", str(mine.root))  # the genuine signature back
    assert skopeo.copy(tag).returncode == 0 and cosign_verify(tmp_path, key, image).returncode == 0
    changed = push(layout[0], host, "--upgrade-from", "1.0.0")  # same layout, another manifest, same tag
    assert changed["tag"] == tag and changed["digest"] != digest
    refused(skopeo.copy(tag), "Source image rejected: A signature was required, but no signature exists")
    refused(cosign_verify(tmp_path, key, image), "no signatures found")
    genuine = client.get_manifest(f"sha256-{digest[7:]}.sig")
    assert genuine is not None
    client.put_manifest(f"sha256-{changed['digest'][7:]}.sig", genuine[0])
    refused(skopeo.copy(tag), "does not match")
    refused(cosign_verify(tmp_path, key, image), "no matching signatures")
    verdict = kiln("verify", image, "--key", str(key))
    assert verdict.returncode == 1 and f"names {digest}, not the image {changed['digest']}" in verdict.stderr


def test_kiln_verify_takes_what_cosign_signs(
    layout: tuple[Path, Path], registry: tuple[str, Path], tmp_path: Path
) -> None:
    """The other way round: `cosign sign --key` (its own key pair, no transparency log) over an unsigned
    push, and `kiln verify` accepts it with cosign's public key, and only with it."""
    host, _ = registry
    pushed = push(layout[0], host)
    image = f"{host}/{REPO}@{pushed['digest']}"
    cosign = tool("cosign")
    env = {**os.environ, "HOME": str(tmp_path), "COSIGN_PASSWORD": "not secret"}
    for args in (
        ["generate-key-pair", "--output-key-prefix", str(tmp_path / "cosign")],
        ["sign", "--key", str(tmp_path / "cosign.key"), "--tlog-upload=false", "--allow-insecure-registry",
         "--allow-http-registry", "-y", image],
    ):  # fmt: skip
        made = subprocess.run([*cosign, *args], capture_output=True, text=True, timeout=300, check=False, env=env)
        assert made.returncode == 0, made.stdout + made.stderr
    verdict = kiln("verify", image, "--key", str(tmp_path / "cosign.pub"))
    assert verdict.returncode == 0 and f"{pushed['digest']} signed by" in verdict.stdout, verdict.stderr
    other, _ = image_keys(tmp_path / "other")
    foreign = kiln("verify", image, "--key", str(other.release_image_public))
    assert foreign.returncode == 1 and "is not by a trusted key" in foreign.stderr, foreign.stderr


def cosign_verify_attestation(work: Path, public_key: Path, image: str) -> subprocess.CompletedProcess[str]:
    """`cosign verify-attestation --key --type slsaprovenance1`, as cosign_verify runs `cosign verify`."""
    return subprocess.run(
        [*tool("cosign"), "verify-attestation", "--key", str(public_key), "--type", "slsaprovenance1",
         "--insecure-ignore-tlog", "--allow-insecure-registry", "--allow-http-registry", image],
        capture_output=True, text=True, timeout=300, check=False, env={**os.environ, "HOME": str(work)},
    )  # fmt: skip


def test_cosign_verifies_the_provenance_attested_beside_each_signature(
    layout: tuple[Path, Path], registry: tuple[str, Path], tmp_path: Path, part: Part
) -> None:
    """A signed push of a layout whose directory holds a provenance (a real one, of a small package tree)
    attests the pushed manifest with it; `cosign verify-attestation` and `kiln verify` accept it with the
    image release key and refuse another key's, and an attestation moved onto another manifest."""
    host, _ = registry
    (mine, _), (theirs, other) = image_keys(tmp_path / "mine"), image_keys(tmp_path / "other")
    release = tmp_path / "release"
    shutil.copytree(layout[0], release / "installer")
    written(output_directory(tmp_path / "built", part.profile), part)
    shutil.copy(tmp_path / "built" / PROVENANCE, release / PROVENANCE)
    pushed = push(release / "installer", host, "--sign", str(mine.root))
    digest = pushed["digest"]
    assert pushed["attestations"] == {digest: f"sha256-{digest[7:]}.att"}, pushed
    image, key = f"{host}/{REPO}@{digest}", mine.release_image_public

    accepted = cosign_verify_attestation(tmp_path, key, image)
    assert accepted.returncode == 0, accepted.stderr
    statement = json.loads(base64.b64decode(json.loads(accepted.stdout.splitlines()[0])["payload"]))
    assert statement["subject"] == [{"name": f"{host}/{REPO}", "digest": {"sha256": digest[7:]}}]
    provenance = json.loads((release / PROVENANCE).read_text())
    assert statement["predicate"] == provenance["predicate"]
    verdict = kiln("verify", image, "--key", str(key), "--json")
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    [checked] = json.loads(verdict.stdout)["images"]
    assert checked["attestation"]["predicate_type"] == "https://slsa.dev/provenance/v1", checked

    refused(
        cosign_verify_attestation(tmp_path, theirs.release_image_public, image),
        "accepted signatures do not match threshold",
    )

    # the genuine attestation moved onto another signed manifest of the same repository
    client = Client(Ref.parse(f"{host}/{REPO}"))
    changed = push(release / "installer", host, "--sign", str(mine.root), "--upgrade-from", "1.0.0")
    genuine = client.get_manifest(f"sha256-{digest[7:]}.att")
    assert genuine is not None and changed["digest"] != digest
    client.put_manifest(f"sha256-{changed['digest'][7:]}.att", genuine[0])
    moved = f"{host}/{REPO}@{changed['digest']}"
    refused(cosign_verify_attestation(tmp_path, key, moved), "no matching subject digest found")
    verdict = kiln("verify", moved, "--key", str(key))
    assert verdict.returncode == 1 and "its statement names other images" in verdict.stderr, verdict.stderr

    # another key's attestation of the right manifest
    forged = attest_digest(digest, f"{host}/{REPO}", provenance, other)
    put_artifact(client, f"sha256-{digest[7:]}.att", forged.blobs, forged.manifest)
    verdict = kiln("verify", image, "--key", str(key))
    assert verdict.returncode == 1 and "is not by a trusted key" in verdict.stderr, verdict.stderr
