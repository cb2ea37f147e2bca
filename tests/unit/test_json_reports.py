"""--json on the verbs that report and had none: keys generate, verify (a good and a damaged release)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from kiln.signing.keyset import KeySet
from kiln.signing.release import sign_release
from tests.conftest import Result


def test_keys_generate_and_verify_report_as_json(kiln: Callable[..., Result], tmp_path: Path) -> None:
    made = kiln("keys", "generate", "keys", "--json")
    assert made.code == 0, made.err
    written = json.loads(made.out)["files"]
    assert {Path(f["path"]).name for f in written} >= {"release.key", "release.pub", "db.crt"}
    release = tmp_path / "release"
    (release / "metal").mkdir(parents=True)
    (release / "metal" / "metal-amd64.raw.zst").write_bytes(b"disk")
    sign_release(release, KeySet(tmp_path / "keys"))
    good = kiln("verify", "release", "--key", "keys/release.pub", "--json")
    report = json.loads(good.out)
    assert good.code == 0 and report["ok"] is True and report["files"] == 1 and report["signer"]
    (release / "metal" / "metal-amd64.raw.zst").write_bytes(b"damaged")
    bad = kiln("verify", "release", "--key", "keys/release.pub", "--json")
    report = json.loads(bad.out)
    assert bad.code == 1 and report["ok"] is False and "metal/metal-amd64.raw.zst" in report["error"]
    plain = kiln("verify", "release", "--key", "keys/release.pub")  # without --json: the usual message
    assert plain.code == 1 and "checksum differs" in plain.err
