"""One retry policy for whatever may work later (a connection, a request to a store): ``retries`` more
attempts, waiting ``delay`` seconds before the first, doubling up to :data:`MAX_BACKOFF`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

MAX_BACKOFF = 30.0


@dataclass(frozen=True)
class Retry:
    """``retries`` attempts after the first, the first of them ``delay`` seconds after a failure."""

    retries: int = 5
    delay: float = 1.0

    def wait(self, failures: int) -> float:
        """The wait before the attempt after the ``failures``-th failure (1 for the first)."""
        return float(min(self.delay * 2 ** (failures - 1), MAX_BACKOFF))

    def call(
        self,
        request: Callable[[], T],
        transient: Callable[[BaseException], bool],
        notice: Callable[[str], object] = lambda text: None,
        sleep: Callable[[float], object] = time.sleep,
    ) -> T:
        """``request()``, tried again while what it raises is ``transient`` and retries are left; each wait
        is said to ``notice`` as it begins (``ERROR; retry N/RETRIES in S s``)."""
        failures = 0
        while True:
            try:
                return request()
            except Exception as exc:
                failures += 1
                if failures > self.retries or not transient(exc):
                    raise
                delay = self.wait(failures)
                notice(f"{exc}; retry {failures}/{self.retries} in {delay:g} s")
                sleep(delay)
