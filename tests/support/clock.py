"""A clock a test moves by hand, for the code that takes one (``timer=``) instead of reading time.monotonic."""

from __future__ import annotations


class Clock:
    """Monotonic seconds that pass only when the test adds to :attr:`now`."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
