"""`sendstream convert --to-version 1` as a subprocess on a hole of exabytes: refused before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.downgrading import fallocate, hole_stream

from sendstream import Command, StreamHeader
from sendstream.errors import LimitExceeded
from sendstream.ops.downgrade import V1_WRITE_SIZE, Downgrader


def test_a_hole_of_exabytes_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """149 bytes asked for 4.6 EB of zeros: a punched hole after a TRUNCATE to 2^62 is written as
    zeros only up to --max-zero-fill; in a file whose size the stream does not show, it is refused
    (the size is not guessed: --parent gives it)."""
    unknown_size = hole_stream(fallocate(b"f", 3, 0, 1 << 62))
    truncated = hole_stream(
        Command.build("truncate", [("path", b"f"), ("size", 1 << 62)]), fallocate(b"f", 3, 0, 1 << 62)
    )
    assert len(unknown_size) < len(truncated) <= 149
    for data, code, says in (
        (unknown_size, 1, "give the parent with --parent"),
        (truncated, 8, "--max-zero-fill raises it"),
    ):
        source, out = tmp_path / "in.stream", tmp_path / "out.stream"
        source.write_bytes(data)
        done = subprocess.run(
            [sys.executable, "-m", "sendstream", "convert", "--to-version", "1", str(source), str(out)],
            capture_output=True,
            timeout=60,
        )
        message = done.stderr.decode()
        assert done.returncode == code, message
        assert "(fallocate)" in message and says in message and "Traceback" not in message
        assert not out.exists()
    # in the library: the error comes before the first WRITE of the command
    d = Downgrader(max_zero_fill=10 * V1_WRITE_SIZE, parent={b"g": 1 << 62}.get)
    d.send(StreamHeader(0, 2))
    with pytest.raises(LimitExceeded) as info:
        next(d.events(fallocate(b"g", 3, 0, 1 << 62)))
    assert info.value.option == "--max-zero-fill" and info.value.limit == 10 * V1_WRITE_SIZE
