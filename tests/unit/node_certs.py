"""Throwaway certificates for the node client's tests, made with the openssl CLI (fleets use kiln secrets).

Two CAs: `ca` signs a machine's server certificate (SAN 127.0.0.1 and localhost), the client's
certificate, and `elsewhere`, a server certificate that names only elsewhere.example; `other-ca`
signs `stranger`, a server certificate no client of `ca` may trust. Elliptic-curve keys: a dozen
openssl runs take well under a second.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    directory: Path

    def crt(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def pem(self, name: str) -> str:
        return self.crt(name).read_text()


def openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"openssl {' '.join(args)}: {result.stderr}"


def _new_key(name: str) -> list[str]:
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key"]


def _ca(name: str, cwd: Path) -> None:
    openssl("req", "-x509", *_new_key(name), "-out", f"{name}.crt", "-subj", f"/CN={name}", "-days", "2", cwd=cwd)


def _leaf(name: str, ca: str, cwd: Path, san: str | None) -> None:
    openssl("req", *_new_key(name), "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=cwd)
    extra: list[str] = []
    if san:
        (cwd / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        extra = ["-extfile", f"{name}.ext"]
    signed = ["-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "2"]
    openssl("x509", "-req", "-in", f"{name}.csr", *signed, "-out", f"{name}.crt", *extra, cwd=cwd)


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", directory)
    _ca("other-ca", directory)
    _leaf("server", "ca", directory, "IP:127.0.0.1,DNS:localhost")
    _leaf("client", "ca", directory, None)
    _leaf("elsewhere", "ca", directory, "DNS:elsewhere.example")
    _leaf("stranger", "other-ca", directory, "IP:127.0.0.1,DNS:localhost")
    return Certs(directory)
