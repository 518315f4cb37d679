"""Pacing: a token bucket that spreads a byte rate evenly, with no clock of its own (sans-IO), and the
channel layer that sends through one (``--rate-limit``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from .tls.channel import Channel, Wrapping

BURST_SECONDS = 0.05  # the bucket holds 50 ms of the rate: over 2 s, at most 2.5% ahead
MIN_BURST = 4096


class TokenBucket:
    """``rate`` bytes a second, never more than :attr:`burst` bytes at once.

    The caller asks :meth:`delay` before sending at most :attr:`burst` bytes
    and waits as long as it says. Tokens accrue from the time of each call
    (the caller's clock) up to :attr:`burst`; a grant may overdraw them, and
    the wait pays the debt, so the average stays exactly ``rate`` and no
    window of ``T`` seconds carries more than ``rate * T + burst`` bytes.
    """

    def __init__(self, rate: float, now: float, burst: int | None = None) -> None:
        if not rate > 0:
            raise ValueError(f"a rate must be more than 0 bytes/s, got {rate}")
        self.rate = float(rate)
        self.burst = burst or max(int(rate * BURST_SECONDS), MIN_BURST)
        self._tokens = float(self.burst)
        self._at = now

    def delay(self, n: int, now: float) -> float:
        """Take ``n`` bytes at ``now``: the seconds to wait before sending them."""
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate) - n
        self._at = now
        return -self._tokens / self.rate if self._tokens < 0 else 0.0


class Paced(Wrapping):
    """A layer that sends no faster than ``rate`` bytes a second, evenly: at most a burst of the
    :class:`TokenBucket` at once, each after the wait it says (``clock`` and ``sleep``: the time's)."""

    def __init__(
        self,
        channel: Channel,
        rate: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        super().__init__(channel)
        self._clock, self._sleep = clock, sleep
        self._bucket = TokenBucket(rate, clock())

    def write(self, view: memoryview) -> None:
        step = self._bucket.burst
        for start in range(0, len(view), step):
            piece = view[start : start + step]
            self._pace(len(piece))
            self.inner.write(piece)

    def write_file(self, fd: int, offset: int, count: int) -> int:
        sent = 0
        while sent < count:
            piece = min(self._bucket.burst, count - sent)
            self._pace(piece)
            n = self.inner.write_file(fd, offset + sent, piece)
            sent += n
            if n < piece:
                break
        return sent

    def _pace(self, n: int) -> None:
        if wait := self._bucket.delay(n, self._clock()):
            self._sleep(wait)
