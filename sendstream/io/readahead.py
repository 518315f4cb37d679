"""Reading ahead: a thread takes what a producer writes into memory while the consumer is busy.

``btrfs send`` writes in bursts (a directory of small files, then a large
extent); a pipe holds 1 MiB, so while the network is slower than a burst
the producer waits on a full pipe, and its disk then idles. With a read-ahead
of SIZE bytes the producer runs on until SIZE bytes are waiting, as
``mbuffer -m SIZE`` does. Memory grows by at most SIZE and one read.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import Any, BinaryIO

from .pipes import widen
from .threads import started
from .windows import read_what_is_there

READ_SIZE = 1 << 20


class ReadAhead:
    """``source`` read in a thread, at most ``size`` bytes ahead of :meth:`readinto1`."""

    def __init__(self, source: BinaryIO, size: int) -> None:
        self._read = read_what_is_there(source)
        with contextlib.suppress(AttributeError, OSError, ValueError):
            widen(source.fileno())
        self.size = size
        self._chunks: deque[memoryview] = deque()
        self._held = 0
        self._ended = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = started(self._fill)

    def _fill(self) -> None:
        scratch = memoryview(bytearray(min(self.size, READ_SIZE)))
        try:
            while True:
                with self._cond:
                    while self._held >= self.size:
                        self._cond.wait()
                    room = self.size - self._held
                n = self._read(scratch[:room]) or 0
                with self._cond:
                    if n:
                        self._chunks.append(memoryview(bytes(scratch[:n])))  # a copy: exactly what came
                        self._held += n
                    else:
                        self._ended = True
                    self._cond.notify_all()
                if not n:
                    return
        except BaseException as exc:
            with self._cond:
                self._error, self._ended = exc, True
                self._cond.notify_all()

    def readinto1(self, view: Any) -> int:
        """What is held, at least one byte (waiting for it), up to ``len(view)``; 0 at the end of ``source``."""
        out = memoryview(view).cast("B")
        with self._cond:
            while not self._chunks and not self._ended:
                self._cond.wait()
            if not self._chunks:
                if self._error is not None:
                    raise self._error
                return 0
            n = 0
            while self._chunks and n < len(out):
                chunk = self._chunks[0]
                k = min(len(chunk), len(out) - n)
                out[n : n + k] = chunk[:k]
                if k == len(chunk):
                    self._chunks.popleft()
                else:
                    self._chunks[0] = chunk[k:]
                n += k
            self._held -= n
            self._cond.notify_all()
            return n

    readinto = readinto1
