"""What the decoder hands out: stream headers, commands, restarts, the end of input, or "need more data"."""

from __future__ import annotations

from dataclasses import dataclass

from .. import errors as e
from ..format.command import Command


@dataclass(frozen=True, slots=True)
class StreamHeader:
    """A stream header ("btrfs-stream", version) at ``offset``."""

    offset: int
    version: int


@dataclass(frozen=True, slots=True)
class Restart:
    """A restarted send at ``offset``: a new header of ``version`` after
    ``commands`` complete commands of the stream and ``partial`` bytes of an
    unfinished one. The whole stream follows again."""

    offset: int
    version: int
    commands: int
    partial: int

    def error(self, index: int) -> e.StreamRestarted:
        """The problem this restart is, found before command ``index`` of the input."""
        return e.StreamRestarted(
            f"stream restarted at offset {self.offset} after {self.commands} complete commands; "
            f"{self.partial} bytes of a partial command before it",
            offset=self.offset,
            index=index,
        )


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The input ended cleanly after a complete stream, at ``offset``."""

    offset: int


class NeedData:
    """Returned when the next event needs more input."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = NeedData()
Event = StreamHeader | Command | Restart | EndOfInput
