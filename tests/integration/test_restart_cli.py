"""Restarted streams through the commands: verify names the restart, --scan lists the headers, repair
heals (and leaves no half-written file), convert refuses; on each backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.streams import FIXTURES, backend_env, boundaries

from sendstream.codec.backend import Backend

SMALL = FIXTURES / "rich-incr-v2.stream"


def run(*args: str, stdin: bytes = b"", backend: Backend) -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, "-m", "sendstream", *args]
    return subprocess.run(command, input=stdin, capture_output=True, env=backend_env(backend))


def test_cli_verify_scan_and_repair(tmp_path: Path, backend: Backend) -> None:
    data = SMALL.read_bytes()
    cut = boundaries(data)[25] + 11
    damaged = tmp_path / "damaged.stream"
    damaged.write_bytes(data[:cut] + data)
    verify = run("verify", str(damaged), backend=backend)
    assert verify.returncode == 5
    assert f"stream restarted at offset {cut} after 24 complete commands; 11 bytes of a partial command" in (
        verify.stderr.decode()
    )
    scan = run("verify", "--scan", str(damaged), backend=backend)
    assert scan.stdout.decode() == (
        f"offset 0: stream header, version 2\noffset {cut}: stream header, version 2\n2 stream headers\n"
    )
    fixed = tmp_path / "fixed.stream"
    result = run("repair", str(damaged), str(fixed), backend=backend)
    assert result.returncode == 0 and fixed.read_bytes() == data
    assert b"1 restart repaired" in result.stderr
    piped = run("repair", "-", "-", stdin=damaged.read_bytes(), backend=backend)
    assert piped.returncode == 0 and piped.stdout == data


def test_cli_repair_leaves_no_half_written_file(tmp_path: Path, backend: Backend) -> None:
    data = SMALL.read_bytes()
    other = (FIXTURES / "rich-full-v2.stream").read_bytes()
    damaged = tmp_path / "damaged.stream"
    damaged.write_bytes(data[: boundaries(data)[30]] + other)
    out = tmp_path / "out.stream"
    result = run("repair", str(damaged), str(out), backend=backend)
    assert result.returncode == 5 and b"replay differs" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["damaged.stream"]
    kept = run("repair", "--keep-last", str(damaged), str(out), backend=backend)
    assert kept.returncode == 0 and out.read_bytes() == other
    assert (
        run("repair", "--keep-last", str(damaged), "-", backend=backend).returncode == 2
    )  # a pipe cannot be truncated


def test_convert_refuses_a_restarted_stream(tmp_path: Path, backend: Backend) -> None:
    data = SMALL.read_bytes()
    result = run("convert", "-", str(tmp_path / "x"), stdin=data[:500] + data, backend=backend)
    assert result.returncode == 5 and not (tmp_path / "x").exists()
