"""Ports, key files and the CLI's sender and receiver as real processes. Standard library only: the
transport benchmark of tools/ takes ``listening`` from here."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

CMD = [sys.executable, "-m", "sendstream"]


def free_port(family: int = socket.AF_INET) -> int:
    with socket.socket(family) as s:
        s.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def receiver(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*CMD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def announced(proc: subprocess.Popen[bytes]) -> tuple[int, bytes]:
    """The port that ``proc``, listening on port 0, says it got (``sendstream: listening on HOST:PORT`` on
    its stderr, a pipe), and what it wrote to stderr up to that line, the line included (read from the pipe
    now, so no longer in what ``communicate`` returns)."""
    assert proc.stderr is not None
    said = b""
    for line in proc.stderr:
        said += line
        if line.startswith(b"sendstream: listening on "):
            return int(line.rsplit(b":", 1)[1]), said
    raise AssertionError(f"the listener ended ({proc.wait()}) without saying where it listens: {said!r}")


def sender(*args: str, data: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """Run `sendstream send`, again while the receiver is not listening yet."""
    deadline = time.monotonic() + 10
    while True:
        result = subprocess.run([*CMD, "send", *args], input=data, capture_output=True)
        if b"connection refused" not in result.stderr.lower() or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


def listening(port: int) -> bool:
    """Whether something listens on TCP ``port``, IPv4 or IPv6 (read from /proc: a probe connection would be a
    client)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table, encoding="ascii") as f:
            rows = [line.split() for line in f.readlines()[1:]]
            if any(int(r[1].rsplit(":", 1)[1], 16) == port and r[3] == "0A" for r in rows):
                return True
    return False


def wait_listening(port: int, timeout: float = 20) -> None:
    """Until something listens on TCP ``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if listening(port):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port} after {timeout} s")


def tls_args(mode: str, key: Path) -> list[str]:
    return ["--tls", mode] if mode == "none" else ["--tls", mode, "--key", str(key)]


def transfer(
    mode: str, key: Path, out: Path, data: bytes, *extra: str
) -> tuple[subprocess.CompletedProcess[bytes], tuple[int, bytes]]:
    recv = receiver("receive", "--listen", "127.0.0.1:0", "-o", str(out), *tls_args(mode, key))
    try:
        port, said = announced(recv)  # a sender that fails before it connects tells only a receiver that listens
        sent = sender("--to", f"127.0.0.1:{port}", "-", *tls_args(mode, key), *extra, data=data)
        _, err = recv.communicate(timeout=60)
    finally:
        recv.kill()
    return sent, (recv.returncode, said + err)


def raw_sender(port: int, payload: bytes, *, host: str = "127.0.0.1", reset: bool = False) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            sock = socket.create_connection((host, port))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with sock:
        sock.sendall(payload)
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


def key_file(path: Path) -> Path:
    """A fresh 32-byte pre-shared key at ``path``, readable by its owner only."""
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path
