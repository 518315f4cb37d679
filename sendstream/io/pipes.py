"""Pipes with room: a wider kernel buffer where the system allows it."""

from __future__ import annotations

import fcntl
import os
import stat

PIPE_SIZE = 1 << 20  # the default /proc/sys/fs/pipe-max-size


def widen(fd: int) -> None:
    """Give the pipe ``fd`` (if it is one) a buffer of :data:`PIPE_SIZE`, best effort.

    A pipe holds 64 KiB by default: its writer blocks and its reader wakes
    every 64 KiB, so a stage between two others makes many small reads and
    writes, each with its own cost. With 1 MiB the stages run further apart
    and each read takes more (measured in docs/contributing/pipelines.md).
    Reads still return what has arrived. A user over the system's limit of
    pipe memory keeps the default.
    """
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) < PIPE_SIZE:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass
