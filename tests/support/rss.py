"""The peak resident memory of a command, run as a process of its own.

``ru_maxrss`` from ``wait4`` counts what the process held before it called exec too (a child of
pytest starts as a copy of pytest), so the command is started by a small launcher that reports its
child's figure: that child starts as a copy of the launcher, a few MB. ``MALLOC_ARENA_MAX=2`` keeps
glibc from giving each thread an arena of its own, as a deployment would set it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def peak_rss(
    argv: list[str], env: dict[str, str], report: Path, timeout: float = 300
) -> tuple[subprocess.CompletedProcess[bytes], int]:
    """Run ``argv``; what it did, and its peak RSS in bytes (``report`` holds the figure meanwhile)."""
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, str(report), *argv],
        capture_output=True,
        env=dict(env, MALLOC_ARENA_MAX="2"),
        timeout=timeout,
    )
    return done, int(report.read_text()) * 1024
