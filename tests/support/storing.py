"""The service in this process (:func:`serving`), and writers that misbehave as a filling disk does, put
under every :class:`~sendstream.io.outputs.OutputFile` (:func:`writing_through`).

A write to a file may take fewer bytes than it was given (a file-size limit,
a disk that fills and is freed a moment later); CPython ignores SIGXFSZ and a
full disk cannot be freed on cue, so the tests inject the raw file instead:
:func:`writing_through` makes one of the classes here the base class of
``OutputFile`` while it is held, in this process (:mod:`short_serve` does it
in a ``sendstream`` process).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sendstream.io.outputs import OutputFile
from sendstream.service.config import load
from sendstream.service.log import EventLog
from sendstream.service.server import Service

from .net import CMD, key_file, wait_listening


class Tally:
    """How often the injected writer misbehaved."""

    short = 0


class ShortFileIO(io.FileIO):
    """Of the writes of more than 64 bytes to a file, every other one (its first one first) takes only
    half of what it is given, and says so; smaller ones (a stream's header) are written whole."""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) > 64:
            calls = self.__dict__["calls"] = self.__dict__.get("calls", 0) + 1
            if calls % 2:
                Tally.short += 1
                return int(super().write(view[: len(view) // 2]))
        return int(super().write(view))


class LyingFileIO(io.FileIO):
    """One write of more than 64 bytes takes only half of it, and says it took all (a broken layer)."""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) > 64 and not Tally.short:
            Tally.short += 1
            super().write(view[: len(view) // 2])
            return len(view)
        return int(super().write(view))


class FullFileIO(io.FileIO):
    """A disk that fills: the write that would pass :attr:`room` bytes in all fails with ENOSPC."""

    room = 1 << 20
    written = 0

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        if FullFileIO.written + n > FullFileIO.room:
            Tally.short += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        FullFileIO.written += n
        return int(super().write(data))


@contextlib.contextmanager
def writing_through(kind: type[io.FileIO]) -> Iterator[type[Tally]]:
    """Every ``OutputFile`` writes through ``kind`` while this is held."""
    Tally.short, FullFileIO.written = 0, 0
    OutputFile.__bases__ = (kind,)
    try:
        yield Tally
    finally:
        OutputFile.__bases__ = (io.FileIO,)


class Log(io.StringIO):
    """The service's event log (JSON lines), written by the service's threads."""

    def __init__(self) -> None:
        super().__init__()
        self._written = threading.Condition()

    def write(self, text: str) -> int:
        with self._written:
            n = super().write(text)
            self._written.notify_all()
            return n

    def events(self) -> list[dict[str, Any]]:
        with self._written:
            return [json.loads(line) for line in self.getvalue().splitlines()]

    def first(self, event: str, timeout: float = 60) -> dict[str, Any]:
        """The first ``event`` logged, once it is (woken by each write, not polled)."""
        with self._written:
            found = self._written.wait_for(lambda: [e for e in self.events() if e["event"] == event], timeout)
        assert found, f"no {event!r} event after {timeout} s: {self.getvalue()}"
        return found[0]


@contextlib.contextmanager
def serving(tmp_path: Path, extra: str = "") -> Iterator[tuple[int, Log]]:
    """``sendstream serve`` in this process, in a thread, for the client ``alpha`` (its key ``alpha.key``),
    storing into ``places/alpha`` (``extra``: more settings of the service): its port (port 0 in the
    configuration: the one its "listening" event says it got) and its event log."""
    key_file(tmp_path / "alpha.key")
    (tmp_path / "places" / "alpha").mkdir(parents=True)
    config = tmp_path / "serve.toml"
    config.write_text(f'listen = "127.0.0.1:0"\n{extra}\n[clients.alpha]\nkey = "alpha.key"\nstore = "places/alpha"\n')
    log = Log()
    with running(Service(load(str(config)), EventLog(log, "json"))):
        yield int(log.first("listening")["address"].rsplit(":", 1)[1]), log


@contextlib.contextmanager
def running(service: Service) -> Iterator[threading.Event]:
    """``service`` run in a thread of this process while this is held (the event stops it early). A service
    that has not ended a minute after it is stopped fails the test with the stack of every thread, rather
    than hold pytest's exit for ever."""
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(60)
        if thread.is_alive():
            raise AssertionError(f"the service did not end within 60 s of its stop:\n{stacks()}")


def stacks() -> str:
    """Where every thread of this process is."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
        for ident, frame in sys._current_frames().items()
    )


def sending(port: int, tmp_path: Path, stream: Path, *extra: str) -> list[str]:
    """The command that sends ``stream`` as ``alpha`` to the service of :func:`serving`."""
    argv = [*CMD, "send", "--to", f"127.0.0.1:{port}", str(stream), "--key", str(tmp_path / "alpha.key")]
    return [*argv, "--identity", "alpha", "--progress", "none", *extra]


@contextlib.contextmanager
def service(config: Path, port: int, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``sendstream serve`` of ``config`` as a process, its JSON log on its stderr, once it listens on ``port``;
    stopped (SIGTERM, then SIGKILL) at the end."""
    argv = [*CMD, "serve", "--config", str(config), "--log-format", "json", *extra]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE)
    try:
        wait_listening(port)
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
