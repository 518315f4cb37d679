"""A `sendstream` process fed by a writer that may pause, its output read as it comes; what a command
writes for a whole input or a prefix. The pipeline benchmark of tools/ uses it too."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from .streams import ROOT, boundaries

PAUSE_WAIT = 5.0  # how long a paused writer waits for the output of what it wrote


class Pipeline:
    """``sendstream ARGS`` with a writer on its standard input and a reader on its output."""

    def __init__(self, args: list[str]) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sendstream", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.out = bytearray()
        self._grew = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := os.read(self.proc.stdout.fileno(), 1 << 16):
            with self._grew:
                self.out += chunk
                self._grew.notify_all()

    def wait_for(self, done: Callable[[bytes], bool], timeout: float = PAUSE_WAIT) -> bytes:
        """The output once ``done(output)`` holds, or as it is after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._grew:
            while not done(bytes(self.out)) and (left := deadline - time.monotonic()) > 0:
                self._grew.wait(left)
            return bytes(self.out)

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, bytes, bytes]:
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        err = self.proc.stderr.read()
        code = self.proc.wait(30)
        self._reader.join(30)
        return code, bytes(self.out), err


def whole(args: list[str], data: bytes) -> bytes:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "sendstream", *args], input=data, capture_output=True, env=env, check=True
    ).stdout


def halfway(data: bytes) -> int:
    """A command boundary near the middle of ``data``."""
    cuts = boundaries(data)
    return min(cuts, key=lambda c: abs(c - len(data) // 2))


def truncated(args: list[str], data: bytes) -> bytes:
    """What ``sendstream ARGS`` writes for ``data`` alone, an input that ends there."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "sendstream", *args], input=data, capture_output=True, env=env).stdout
