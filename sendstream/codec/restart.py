"""Restart detection: a restarted send ioctl's new stream header in the middle of a stream.

A restarted send writes a fresh header (and the whole stream again) after
what it wrote before, often after part of a command (see FORMAT.md). The
framer asks here when a command cannot be framed or checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import errors as e
from ..format.layout import (
    C_END,
    COMMAND_HEADER,
    COMMAND_HEADER_SIZE,
    MAX_VERSION,
    STREAM_HEADER_SIZE,
    STREAM_MAGIC,
)
from .crc import crc32c
from .limits import default_max_command_size

# The header of the stream's next command is the start of a new stream header:
# what a restarted send ioctl leaves behind.
RESTART_LENGTH = int.from_bytes(STREAM_MAGIC[:4], "little")
# A restart header can begin in the last bytes of a command that happen to
# equal its first ones, and is no restart when an END command ends right
# before it: windows keep the bytes before their position that both need
# (a window that kept fewer decided otherwise than one that held it all).
HISTORY = len(STREAM_MAGIC) - 1 + COMMAND_HEADER_SIZE

_unpack_cmd = COMMAND_HEADER.unpack_from
_pack_cmd = COMMAND_HEADER.pack
_END_COMMAND = _pack_cmd(0, C_END, crc32c(_pack_cmd(0, C_END, 0)))


@dataclass(frozen=True, slots=True)
class RestartHeader:
    """A restarted stream's header at window position ``at``, of ``version``, whose first command checks out."""

    at: int
    version: int


def find_restart(
    mv: memoryview, pos: int, eof: bool, origin: int, span_end: int, index: int
) -> RestartHeader | int | None:
    """Look for a restarted stream: a new header starting in ``[pos, span_end)``.

    Returns the header found, or how many bytes from ``pos`` must be there
    to tell, or None when there is none. A header counts only when the
    command after it checks out. At the end of input (``eof``) a header cut
    short raises :class:`~sendstream.errors.TruncatedStream`; ``origin`` is
    the input offset of ``mv[0]`` and ``index`` the next command's, for it.
    """
    end = len(mv)
    lo = max(0, pos - len(STREAM_MAGIC) + 1)  # it may begin in the last bytes before pos
    hi = min(end, span_end + STREAM_HEADER_SIZE)
    found = bytes(mv[lo:hi]).find(STREAM_MAGIC)
    at = lo + found if found >= 0 else -1
    if at < 0 or at >= span_end:
        window = bytes(mv[lo:hi])
        if not eof:
            # a header may still start where the data runs out, in the last bytes before pos too
            for h in range(max(lo, hi - len(STREAM_MAGIC) + 1), span_end):
                if STREAM_MAGIC.startswith(window[h - lo :]):
                    return h - pos + STREAM_HEADER_SIZE + COMMAND_HEADER_SIZE
        tail = next((k for k in range(len(STREAM_MAGIC) - 1, 3, -1) if window.endswith(STREAM_MAGIC[:k])), 0)
        if eof and tail and hi == end and hi - tail < span_end:
            raise e.TruncatedStream(
                "the input ends inside a restarted stream header",
                offset=origin + end - tail,
                index=index,
                expected=f"{STREAM_HEADER_SIZE} bytes",
                actual=f"{tail} bytes",
            )
        return None
    if mv[max(0, at - COMMAND_HEADER_SIZE) : at] == _END_COMMAND:
        return None  # the next of several streams back to back, not a restart
    first = at + STREAM_HEADER_SIZE
    if end - first >= COMMAND_HEADER_SIZE:
        version = int.from_bytes(mv[at + 13 : first], "little")
        if not 1 <= version <= MAX_VERSION:
            return None
        length, cmd, crc = _unpack_cmd(mv, first)
        if length > default_max_command_size(version):
            return None
        body_end: int = first + COMMAND_HEADER_SIZE + length
        if body_end <= end:
            if crc32c(mv[first + COMMAND_HEADER_SIZE : body_end], crc32c(_pack_cmd(length, cmd, 0))) != crc:
                return None
            return RestartHeader(at, version)
    else:
        body_end = first + COMMAND_HEADER_SIZE
    if eof:
        raise e.TruncatedStream(
            "the input ends inside a restarted stream",
            offset=origin + at,
            index=index,
            expected="a stream header and a complete first command",
            actual=f"{end - at} bytes",
        )
    return body_end - pos
