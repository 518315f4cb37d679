"""What a transfer shows and reports: the progress line and the summary."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any


class Progress:
    """A one-line progress report on a terminal; silent otherwise."""

    def __init__(self, label: str, *, enabled: bool | None = None, stream: Any = None) -> None:
        self._stream = stream or sys.stderr
        self._enabled = self._stream.isatty() if enabled is None else enabled
        self._label = label
        self.bytes = 0
        self.started = time.monotonic()
        self._shown = 0.0

    def start(self) -> None:
        """Count the time from now: the transfer begins (a receiver's wait for its sender is not part of it)."""
        self.started = time.monotonic()

    def add(self, n: int) -> None:
        self.bytes += n
        if self._enabled and (now := time.monotonic()) - self._shown >= 0.25:
            self._shown = now
            rate = self.bytes / max(now - self.started, 1e-9) / 1e6
            self._stream.write(f"\r{self._label}: {self.bytes / 1e6:,.1f} MB, {rate:,.1f} MB/s ")
            self._stream.flush()

    def done(self) -> None:
        if self._enabled:
            self._stream.write("\r\x1b[K")
            self._stream.flush()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


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
    skipped: int = 0  # resumed after a restart: the bytes before this offset were not sent

    def line(self, verb: str) -> str:
        rate = self.bytes / max(self.seconds, 1e-9) / 1e6
        text = f"{verb} {self.bytes} bytes in {self.seconds:.2f} s ({rate:,.1f} MB/s); {self.path}"
        if self.skipped:
            text += f"; resumed at offset {self.skipped}"
        if self.restarts:
            text += f"; {self.restarts} restart{'s' * (self.restarts != 1)} healed"
        if self.reconnects:
            text += f"; resumed after {self.reconnects} drop{'s' * (self.reconnects != 1)}"
            if self.resent:
                text += f" ({self.resent} bytes sent again)"
        return text
