"""Every write of ours writes all or fails: a short write never stores a truncated stream as a success.

The service runs in this process (its ``store``), with the raw file under
every :class:`~sendstream.io.outputs.OutputFile` replaced by one that writes
short (:mod:`support.shortwrites`); the senders are real ``sendstream send``
processes. One case runs ``sendstream serve`` itself with the writer injected.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.net import CMD, free_port, key_file, wait_listening
from support.shortwrites import ShortFileIO, writing_through
from support.streams import FIXTURES

from sendstream.ops.identity import stream_identity
from sendstream.ops.stored import stream_name
from sendstream.service.config import load
from sendstream.service.server import EventLog, Service

FULL = FIXTURES / "rich-full-v2.stream"


def configured(tmp_path: Path, port: int) -> Path:
    """A service for the client ``alpha``, storing into ``places/alpha``."""
    key_file(tmp_path / "alpha.key")
    (tmp_path / "places" / "alpha").mkdir(parents=True)
    config = tmp_path / "serve.toml"
    config.write_text(f'listen = "127.0.0.1:{port}"\n[clients.alpha]\nkey = "alpha.key"\nstore = "places/alpha"\n')
    return config


class Log(io.StringIO):
    def events(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.getvalue().splitlines()]


@contextlib.contextmanager
def serving(tmp_path: Path) -> Iterator[tuple[int, Log]]:
    """``sendstream serve`` in this process, in a thread: its port and its event log."""
    port = free_port()
    log, stop = Log(), threading.Event()
    service = Service(load(str(configured(tmp_path, port))), EventLog(log, "json"))
    thread = threading.Thread(target=service.run, args=(stop,))
    thread.start()
    try:
        wait_listening(port)
        yield port, log
    finally:
        stop.set()
        thread.join(60)


def send(port: int, tmp_path: Path, stream: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    argv = [*CMD, "send", "--to", f"127.0.0.1:{port}", str(stream), "--key", str(tmp_path / "alpha.key")]
    argv += ["--identity", "alpha", "--progress", "none", *extra]
    return subprocess.run(argv, capture_output=True, timeout=120)


def place(tmp_path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (tmp_path / "places" / "alpha").iterdir()}


NAME = stream_name(stream_identity(FULL.read_bytes()[: 64 << 10]))


@pytest.mark.parametrize("extra", [(), ("--resumable",)], ids=["plain", "resumable"])
def test_short_writes_store_the_whole_stream(tmp_path: Path, extra: tuple[str, ...]) -> None:
    with writing_through(ShortFileIO) as tally, serving(tmp_path) as (port, log):
        sent = send(port, tmp_path, FULL, *extra)
    assert tally.short > 0, "the injected writer never wrote short"
    assert sent.returncode == 0, sent.stderr
    held = place(tmp_path)
    assert sorted(held) == [NAME, NAME + ".json"]
    assert held[NAME] == FULL.read_bytes(), f"{len(held[NAME])} bytes stored of {FULL.stat().st_size}"
    note = json.loads(held[NAME + ".json"])
    assert note["size"] == FULL.stat().st_size and note["sha256"] == hashlib.sha256(FULL.read_bytes()).hexdigest()
    assert [e["event"] for e in log.events()].count("stored") == 1
