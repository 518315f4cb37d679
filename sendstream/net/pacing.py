"""Pacing: a token bucket that spreads a byte rate evenly, with no clock of its own (sans-IO)."""

from __future__ import annotations

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
