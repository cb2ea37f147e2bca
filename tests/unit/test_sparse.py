"""Reading around holes (kiln.core.sparse), hashing so, and the chunked gzip/xz/zstd of disk images.

Round trips go through the real gzip, xz and zstd tools, as a user's machine would read them."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from kiln.core import sparse
from kiln.core.hashing import SPARSE_FROM, file_sha256
from kiln.image.chunked import ZeroCrc, write_gzip, write_xz, write_zstd

MiB = 1 << 20


def disk(path: Path, *, dense: bool = False) -> Path:
    """A 70.5 MiB file: data at the start, inside the third chunk and across the end of the last
    whole one, a chunk of written zeros, holes elsewhere (or all written out, when `dense`)."""
    rng = random.Random(7)
    size = 70 * MiB + 512 * 1024
    writes = {
        0: b"kiln" * 1024,
        9 * MiB + 17: rng.randbytes(300_000),
        24 * MiB: bytes(4 * MiB),
        68 * MiB - 5: rng.randbytes(MiB),
    }
    with path.open("wb") as out:
        if dense:
            out.write(bytes(size))
        for offset, data in writes.items():
            out.seek(offset)
            out.write(data)
        out.truncate(size)
    return path


def test_chunks_give_the_bytes_and_call_zero_chunks_none(tmp_path: Path) -> None:
    path = disk(tmp_path / "d.raw")
    whole = path.read_bytes()
    offset = 0
    zero_chunks = 0
    for length, data in sparse.chunks(path):
        expected = whole[offset : offset + length]
        if data is None:
            assert expected == bytes(length)
            zero_chunks += 1
        else:
            assert data == expected and data != bytes(length)
        offset += length
    assert offset == len(whole) and length == 2 * MiB + 512 * 1024  # the last chunk is short
    assert zero_chunks == 18 - 4  # 18 chunks, data in 4 of them (a written chunk of zeros counts as zeros)


def test_data_ranges_leave_out_the_holes(tmp_path: Path) -> None:
    path = disk(tmp_path / "d.raw")
    with path.open("rb") as handle:
        ranges = sparse.data_ranges(handle.fileno(), path.stat().st_size)
    if ranges == [(0, path.stat().st_size)]:
        pytest.skip("this filesystem reports no holes")
    assert sum(end - start for start, end in ranges) < 16 * MiB
    assert ranges[0][0] == 0 and ranges[-1][1] >= 69 * MiB


@pytest.mark.parametrize("dense", [False, True])
def test_large_files_hash_as_their_bytes(tmp_path: Path, dense: bool) -> None:
    path = disk(tmp_path / "d.raw", dense=dense)
    assert path.stat().st_size >= SPARSE_FROM
    assert file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(("write", "tool"), [(write_gzip, "gzip"), (write_xz, "xz"), (write_zstd, "zstd")])
def test_chunked_compression_round_trips_and_ignores_how_zeros_are_stored(
    tmp_path: Path, write: Callable[[Path, Path], None], tool: str
) -> None:
    made = []
    for dense in (False, True):
        source = disk(tmp_path / f"d{dense}.raw", dense=dense)
        target = tmp_path / f"d{dense}.out"
        write(source, target)
        back = subprocess.run([tool, "-dc", str(target)], capture_output=True, check=True).stdout
        assert back == source.read_bytes()
        made.append(target.read_bytes())
    assert made[0] == made[1]  # holes and written zeros give the same bytes
    assert len(made[0]) < 2 * MiB


def test_gzip_carries_its_extra_field_and_a_checked_crc(tmp_path: Path) -> None:
    source = disk(tmp_path / "d.raw")
    target = tmp_path / "d.gz"
    write_gzip(source, target, extra=b"KS\x08\x00" + (123).to_bytes(8, "little"))
    data = target.read_bytes()
    assert data[3] == 0x04 and data[10:12] == b"\x0c\x00" and data[12:16] == b"KS\x08\x00"
    subprocess.run(["gzip", "-t", str(target)], check=True)
    corrupt = tmp_path / "bad.gz"
    corrupt.write_bytes(data[:-8] + bytes([data[-8] ^ 1]) + data[-7:])
    assert subprocess.run(["gzip", "-t", str(corrupt)], capture_output=True).returncode != 0


def test_the_crc_of_a_zero_run_matches_zlib() -> None:
    run = ZeroCrc(4096)
    zeros = bytes(4096)
    for crc in (0, 1, 0xFFFFFFFF, 0x80000000, *random.Random(3).sample(range(1 << 32), 20)):
        assert run(crc) == zlib.crc32(zeros, crc)


def test_a_file_that_shrinks_while_read_is_an_error(tmp_path: Path) -> None:
    path = disk(tmp_path / "d.raw")
    pieces = sparse.chunks(path)
    next(pieces)
    os.truncate(path, 8 * MiB)
    with pytest.raises(OSError, match="shrank"):
        list(pieces)
