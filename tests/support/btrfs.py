"""The real btrfs: skips where it is missing, btrfs-progs 6.2's dump as we write it, and the
btrfs-progs binaries whose `receive --dump` each dump style is checked against."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sendstream import Command
from sendstream.io.windows import iter_events
from sendstream.render.dump import TextDumper
from sendstream.render.progs import RELEASES, ProgsStyle, matches
from support.loopfs import require_btrfs
from support.zones import zone


def need_btrfs_progs() -> None:
    if shutil.which("btrfs") is None:
        pytest.skip("btrfs-progs is not installed (apt-get install btrfs-progs); CI installs it")


def need_root_btrfs() -> None:
    need_btrfs_progs()
    reason = require_btrfs()
    if reason:
        pytest.skip(f"needs a real file-backed btrfs: {reason}")


def utc() -> contextlib.AbstractContextManager[None]:
    """Run in the UTC zone (the stored .dump files were made with TZ=UTC)."""
    return zone("UTC")


def first_stream_as_6_2(path: Path) -> bytes:
    """Our text in btrfs-progs 6.2's exact form: raw xattr data, first stream only."""
    dumper = TextDumper(style="6.2", raw_xattr_data=True)
    out = []
    with path.open("rb") as f:
        for ev in iter_events(f):
            if isinstance(ev, Command):
                out.append(dumper.line(ev))
                if ev.name == "end":
                    break
    return b"".join(out)


# Where tools/setup-tests unpacks the btrfs-progs of Debian's bookworm-backports (not installed).
UNPACKED_PROGS = Path(os.environ.get("SENDSTREAM_PROGS_UNPACKED", "/opt/sendstream-progs/backports/bin/btrfs"))


def _release(text: str) -> tuple[int, ...]:
    numbers = tuple(int(n) for n in text.split("."))
    return numbers + (0,) * (3 - len(numbers))  # "6.9" is 6.9.0


def progs_version(binary: str) -> tuple[int, ...] | None:
    """The release of the btrfs-progs at ``binary`` (None when it does not run)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    found = re.search(r"btrfs-progs v(\d+(?:\.\d+)*)", out)
    return _release(found.group(1)) if found else None


def progs_for(style: ProgsStyle) -> str:
    """A btrfs-progs binary whose `receive --dump` text ``style`` is; skips when there is none."""
    first, last = RELEASES[style]
    # the last release as a prefix: "6.19" takes 6.19.1 in
    lowest, highest = _release(first), tuple(int(n) for n in last.split("."))
    seen = []
    for binary in (shutil.which("btrfs"), str(UNPACKED_PROGS)):
        version = progs_version(binary) if binary else None
        if version is None:
            continue
        if lowest <= version and version[: len(highest)] <= highest:
            return str(binary)
        seen.append(f"{binary} is {'.'.join(map(str, version))}")
    pytest.skip(
        f"no btrfs-progs for the {style} dump style ({matches(style)}) here ({'; '.join(seen) or 'none runs'}); "
        "tools/setup-tests unpacks Debian bookworm-backports' into /opt/sendstream-progs/backports "
        "(SENDSTREAM_PROGS_UNPACKED names another btrfs binary)"
    )


def progs_dump(binary: str, path: Path, tz: str) -> subprocess.CompletedProcess[bytes]:
    """``btrfs receive --dump`` of the stream at ``path`` by ``binary``, in the C locale and zone ``tz``
    (progs escapes by isprint(), which follows the locale)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": tz}
    with path.open("rb") as f:
        return subprocess.run([binary, "receive", "--dump"], stdin=f, env=env, capture_output=True)
