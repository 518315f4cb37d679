"""The native and the pure verifier, through the command: the same verdicts, each naming its path."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.streams import FIXTURES, backend_env, boundaries

from sendstream import verify_file
from sendstream.codec.backend import native, pure

NATIVE = native()
pytestmark = pytest.mark.skipif(NATIVE is None, reason="the native module is not built (no compiler at install time)")


def test_verify_reports_the_same_on_both_paths(tmp_path: Path) -> None:
    data = bytearray((FIXTURES / "rich-full-v1.stream").read_bytes())
    marks = boundaries(bytes(data))
    for m in marks[5:40:7]:
        data[m + 11] ^= 2
    bad = tmp_path / "bad.stream"
    bad.write_bytes(bytes(data))
    runs = []
    assert NATIVE is not None
    for backend in (NATIVE, pure()):
        command = [sys.executable, "-m", "sendstream", "verify", "-v", "--keep-going", str(bad)]
        result = subprocess.run(command, capture_output=True, env=backend_env(backend))
        lines = result.stderr.decode().splitlines()
        runs.append((result.returncode, lines[1:], result.stdout.split(b" in ")[0]))
        assert lines[0] == f"sendstream: verifier: {backend.path}; crc32c: {backend.crc_name}"
        in_memory = verify_file(io.BytesIO(bytes(data)), keep_going=True, backend=backend)
        assert [p.offset for p in in_memory.problems] == [m for m in marks[5:40:7]]
    assert runs[0] == runs[1]
    assert runs[0][0] == 1 and len(runs[0][1]) == 5


def test_sendstream_crc_chooses_the_kernel_and_refuses_one_the_processor_lacks() -> None:
    assert NATIVE is not None
    code = "from sendstream.codec.backend import default; print(default().crc_name)"
    env = {k: v for k, v in os.environ.items() if k != "SENDSTREAM_PURE"}
    chosen = subprocess.run(
        [sys.executable, "-c", code], env={**env, "SENDSTREAM_CRC": "table"}, capture_output=True, text=True, check=True
    )
    assert chosen.stdout == "native (slicing-by-8 table)\n"
    argv = [sys.executable, "-m", "sendstream", "verify", str(FIXTURES / "rich-incr-v2.stream")]
    refused = subprocess.run(argv, env={**env, "SENDSTREAM_CRC": "z80"}, capture_output=True, text=True)
    kernels = ", ".join(NATIVE.module.KERNELS)
    assert (refused.returncode, refused.stderr) == (
        2,
        f"sendstream: error: SENDSTREAM_CRC=z80: this processor's CRC-32C kernels are {kernels}\n",
    )
