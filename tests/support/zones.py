"""The process's local time zone, set for a block (what the dump's times and btrfs-progs' follow)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def zone(name: str) -> Iterator[None]:
    """Run in the time zone ``name`` (TZ), skipping when the system has no data for it."""
    if name != "UTC" and not os.path.exists(f"/usr/share/zoneinfo/{name}"):
        pytest.skip(f"no tzdata for {name}")
    old = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()
