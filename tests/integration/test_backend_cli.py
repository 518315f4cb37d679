"""Which backend a command runs, as a user sets it: ``SENDSTREAM_PURE=1``, or the native module when built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.streams import FIXTURES

from sendstream.codec.backend import native

SAMPLE = FIXTURES / "rich-full-v2.stream"


def test_sendstream_pure_still_takes_the_pure_path_in_the_command(tmp_path: Path) -> None:
    """What a user sets: ``verify -v`` names the path that ran."""
    env = {**os.environ, "SENDSTREAM_PURE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "sendstream", "verify", "-v", str(SAMPLE)], capture_output=True, env=env, check=True
    )
    assert done.stderr.decode().startswith("sendstream: verifier: python; crc32c: crc32c package")
    if native() is not None:
        env.pop("SENDSTREAM_PURE")
        done = subprocess.run(
            [sys.executable, "-m", "sendstream", "verify", "-v", str(SAMPLE)], capture_output=True, env=env, check=True
        )
        assert done.stderr.decode().startswith("sendstream: verifier: native (")
