"""What a transfer shows and reports: the progress line (as pv draws it), log lines, and the summary."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BAR, PLAIN, NONE = "bar", "plain", "none"
PLAIN_EVERY = 10.0  # seconds between log lines, unless told
REDRAW = 0.25
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def size(n: float) -> str:
    """``n`` bytes in binary units with three significant digits: ``1.06 GiB``, ``512 B``."""
    unit = 0
    while n >= 1000 and unit < len(_UNITS) - 1:  # 1000 (not 1024): never four digits
        n /= 1024
        unit += 1
    if unit == 0:
        return f"{int(n)} B"
    digits = 0 if n >= 99.95 else 1 if n >= 9.995 else 2
    return f"{n:.{digits}f} {_UNITS[unit]}"


def clock(seconds: float) -> str:
    """``H:MM:SS``, as pv shows time."""
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def parse_mode(text: str) -> tuple[str, float]:
    """``auto``, ``bar``, ``plain[:SECONDS]`` or ``none`` as (mode, seconds between plain lines);
    ``auto`` is returned as is, for :class:`Progress` to decide by its stream."""
    name, _, every = text.partition(":")
    if name not in ("auto", BAR, PLAIN, NONE) or (every and name != PLAIN):
        raise ValueError(f"expected auto, bar, plain[:SECONDS] or none, got {text!r}")
    try:
        seconds = float(every) if every else PLAIN_EVERY
    except ValueError:
        raise ValueError(f"expected plain:SECONDS, got {text!r}") from None
    if not seconds > 0:
        raise ValueError(f"the seconds of plain:SECONDS must be more than 0, got {text!r}")
    return name, seconds


class Progress:
    """A transfer's progress: one line redrawn on a terminal (``bar``), a line every
    ``every`` seconds for logs (``plain``), or nothing (``none``; ``auto``: a bar on a
    terminal, else nothing). With ``total`` known, the percentage and the time left.

    Other output of the same terminal goes through :meth:`above` (a child's
    stderr) and :meth:`note` (a reconnect), so it never mixes with the line.
    """

    def __init__(
        self,
        label: str,
        *,
        mode: str = "auto",
        every: float = PLAIN_EVERY,
        total: int | None = None,
        stream: Any = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream or sys.stderr
        self.mode = (BAR if self._stream.isatty() else NONE) if mode == "auto" else mode
        self._every = every if self.mode == PLAIN else REDRAW
        self._label = label
        self._clock = timer
        self._lock = threading.Lock()
        self._drawn = False  # a bar is on the terminal's current line
        self.total = total
        self.bytes = 0
        self.started = self._shown = 0.0
        self.start()

    def start(self) -> None:
        """Count the time from now: the transfer begins (a receiver's wait for its sender is not part of it)."""
        self.started = self._clock()
        self._shown = self.started - self._every if self.mode == BAR else self.started  # a bar shows at once

    def add(self, n: int) -> None:
        self.bytes += n
        if self.mode != NONE and (now := self._clock()) - self._shown >= self._every:
            self._shown = now
            self._show(self.text(now))

    def text(self, now: float | None = None) -> str:
        """The progress line: label, bytes, elapsed time, rate, and with a total, percentage and ETA."""
        elapsed = (self._clock() if now is None else now) - self.started
        rate = self.bytes / elapsed if elapsed > 0 else 0.0
        text = f"{self._label} {size(self.bytes)} {clock(elapsed)} [{size(rate)}/s]"
        if self.total:
            done = min(self.bytes / self.total, 1.0)
            left = (self.total - self.bytes) / rate if rate > 0 and self.bytes < self.total else 0.0
            text += f" {done:4.0%} ETA {clock(left)}"
        return text

    def note(self, text: str) -> None:
        """A passing state (``connection lost; retry 2/5 in 4 s``): on the bar's line, or a log line."""
        if self.mode == BAR:
            self._show(f"{self.text()}: {text}")
        elif self.mode == PLAIN:
            self.above(f"sendstream: {text}")

    def above(self, line: str) -> None:
        """Print ``line`` (without its newline) on a line of its own, above the bar."""
        with self._lock:
            self._stream.write(("\r\x1b[K" if self._drawn else "") + line + "\n")
            self._drawn = False
            self._stream.flush()

    def done(self) -> None:
        if self.mode == BAR and self._drawn:
            with self._lock:
                self._stream.write("\r\x1b[K")
                self._drawn = False
                self._stream.flush()

    def _show(self, text: str) -> None:
        with self._lock:
            if self.mode == BAR:
                self._stream.write(f"\r{text}\x1b[K")
                self._drawn = True
            else:
                self._stream.write(f"sendstream: {text}\n")
            self._stream.flush()

    @property
    def seconds(self) -> float:
        return self._clock() - self.started


@dataclass
class Summary:
    """What a transfer did."""

    bytes: int
    seconds: float
    path: str
    restarts: int = 0
    status: str = ""
    reconnects: int = 0
    resent: int = 0
    skipped: int = 0  # resumed after a restart: the bytes before this offset were not sent (or received)
    compression: str = ""  # e.g. ``zstd:3 3.41:1 (312 MiB, 327,155,712 bytes on the wire)``

    def line(self, verb: str, *, verbose: bool = False) -> str:
        """One line in the progress line's units; the TLS path's note on kTLS only when ``verbose``."""
        rate = self.bytes / self.seconds if self.seconds > 0 else 0.0
        path = self.path if verbose else self.path.split(" (", 1)[0]
        took = clock(self.seconds) if self.seconds >= 60 else f"{self.seconds:.2f} s"
        text = f"{verb} {size(self.bytes)} ({self.bytes:,} bytes) in {took} [{size(rate)}/s]; {path}"
        if self.compression:
            text += f"; {self.compression}"
        if self.skipped:  # the count of this run, and the stream's: the same words at both ends
            text += f"; resumed at offset {self.skipped} of {self.skipped + self.bytes:,} bytes"
        if self.restarts:
            text += f"; {self.restarts} restart{'s' * (self.restarts != 1)} healed"
        if self.reconnects:
            text += f"; resumed after {self.reconnects} drop{'s' * (self.reconnects != 1)}"
            if self.resent:
                text += f" ({size(self.resent)} sent again)"
        return text
