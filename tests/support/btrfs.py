"""The real btrfs: skips where it is missing, and btrfs-progs 6.2's dump as we write it."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sendstream import Command
from sendstream.io.windows import iter_events
from sendstream.render.dump import TextDumper
from support.loopfs import require_btrfs


def need_btrfs_progs() -> None:
    if shutil.which("btrfs") is None:
        pytest.skip("btrfs-progs is not installed (apt-get install btrfs-progs); CI installs it")


def need_root_btrfs() -> None:
    need_btrfs_progs()
    reason = require_btrfs()
    if reason:
        pytest.skip(f"needs a real file-backed btrfs: {reason}")


@contextlib.contextmanager
def utc() -> Iterator[None]:
    """Run in the UTC zone (the stored .dump files were made with TZ=UTC)."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


def first_stream_as_6_2(path: Path) -> bytes:
    """Our text in btrfs-progs 6.2's exact form: raw xattr data, first stream only."""
    dumper = TextDumper(raw_xattr_data=True)
    out = []
    with path.open("rb") as f:
        for ev in iter_events(f):
            if isinstance(ev, Command):
                out.append(dumper.line(ev))
                if ev.name == "end":
                    break
    return b"".join(out)
