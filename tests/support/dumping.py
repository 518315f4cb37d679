"""Our dump as the command line prints it: a subprocess in a zone and the C locale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sendstream.codec.backend import Backend
from support.streams import backend_env


def our_dump(path: Path, tz: str, *args: str, backend: Backend) -> bytes:
    env = dict(backend_env(backend), TZ=tz, LC_ALL="C")
    return subprocess.run(
        [sys.executable, "-m", "sendstream", "dump", *args, str(path)], env=env, check=True, capture_output=True
    ).stdout
