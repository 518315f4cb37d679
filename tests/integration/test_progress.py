"""The progress line: on a terminal only, off with --quiet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.net import announced
from support.streams import FIXTURES

STREAM = FIXTURES / "rich-full-v2.stream"
CMD = [sys.executable, "-m", "sendstream"]


def send_with_stderr(stderr: int, *extra: str) -> tuple[int, int]:
    receiver = subprocess.Popen(
        [*CMD, "receive", "--listen", "127.0.0.1:0", "--tls", "none", "-o", os.devnull, "-q"],
        stderr=subprocess.PIPE,
    )
    port, _ = announced(receiver)  # it listens before it says so: the sender is not refused
    sender = subprocess.run(
        [*CMD, "send", "--to", f"127.0.0.1:{port}", str(STREAM), "--tls", "none", *extra],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    receiver.communicate(timeout=60)
    return sender.returncode, receiver.returncode


def read_all(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return out
        if not chunk:
            return out
        out += chunk


def test_progress_on_a_terminal(tmp_path: Path) -> None:
    master, slave = os.openpty()
    try:
        codes = send_with_stderr(slave)
    finally:
        os.close(slave)
    shown = read_all(master)
    os.close(master)
    assert codes == (0, 0)
    assert b"\rsent " in shown and (b" KiB/s]" in shown or b" MiB/s]" in shown)
    assert b"\r\x1b[K" in shown
    assert b"sendstream: sent 274 KiB (280,747 bytes) in " in shown


def test_no_progress_elsewhere_or_when_quiet(tmp_path: Path) -> None:
    log = tmp_path / "stderr"
    with log.open("wb") as f:
        assert send_with_stderr(f.fileno()) == (0, 0)
    text = log.read_bytes()
    assert b"\r" not in text and text.startswith(b"sendstream: warning: --tls none")
    master, slave = os.openpty()
    try:
        assert send_with_stderr(slave, "-q") == (0, 0)
    finally:
        os.close(slave)
    quiet = read_all(master)
    os.close(master)
    assert b"\rsent" not in quiet and b"sendstream: sent" not in quiet
