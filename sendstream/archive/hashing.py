"""A digest fed in order in a thread of its own, beside the caller's work (hashlib lets go of the GIL)."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class Hasher:
    """``digest`` updated with each piece given, in order; at most ``depth`` pieces wait for it."""

    def __init__(self, digest: Any, depth: int) -> None:
        self._digest = digest
        self._depth = depth
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="sendstream-hash")
        self._waiting: deque[Future[None]] = deque()

    def update(self, data: Any) -> None:
        while len(self._waiting) >= self._depth:
            self._waiting.popleft().result()
        self._waiting.append(self._pool.submit(self._digest.update, data))

    def close(self, cancel: bool = False) -> None:
        """Every piece given is in the digest when this returns (unless ``cancel``)."""
        self._pool.shutdown(cancel_futures=cancel)
