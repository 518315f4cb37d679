"""zstd on the wire: the sender's direction of one connection, compressed before TLS makes its records.

The sender offers (``sendstream-compress zstd``, its first words after the
handshake) and waits; the receiver answers with the method it takes
(``zstd``, or ``none``), and from then on everything the sender sends on
that connection (a session's hello and frames, or a raw stream) is one zstd
stream. The receiver's direction (answers, acks, the status) stays as it
is. Each write is flushed to the end of a zstd block, so what the sender
has is on the wire at once, as without compression.

A receiver keeps at most :data:`MAX_WINDOW` of history (levels above
:data:`MAX_LEVEL` need more and are refused at the sender), and decompresses
into the buffer it reads into, never more at once: a crafted stream cannot
make it hold more. A truncated zstd stream is caught where the plain stream
would be (TLS close_notify, the session's end frame, the btrfs END).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, cast

from .. import errors as e
from ..errors import SessionError

if TYPE_CHECKING:
    from .tls import Channel

OFFER = b"sendstream-compress "
METHOD = "zstd"
DEFAULT_LEVEL = 3
MAX_LEVEL = 19  # zstd's levels up to 19 keep an 8 MiB window on a stream of unknown size
MAX_WINDOW = 8 << 20
MAX_ANSWER = 64
READ_SIZE = 256 << 10
_LINE = re.compile(rb"sendstream-compress ([a-z0-9]{1,16})\n")


def parse_choice(text: str) -> int:
    """The level of ``zstd[:LEVEL]`` (the ``--compress`` option); ValueError says what was expected."""
    method, _, level = text.partition(":")
    if method != METHOD:
        raise ValueError(f"expected zstd or zstd:LEVEL, got {text!r}")
    if not level:
        return DEFAULT_LEVEL
    if not level.isdigit() or not 1 <= int(level) <= MAX_LEVEL:
        raise ValueError(f"expected a LEVEL of 1 to {MAX_LEVEL} (zstd:LEVEL), got {text!r}")
    return int(level)


def offer_line(method: str) -> bytes:
    """``sendstream-compress METHOD``: the sender's offer, or the receiver's answer."""
    return OFFER + method.encode() + b"\n"


def parse_line(line: bytes, who: str) -> str:
    """The method of an offer or an answer line (``\\n`` included)."""
    match = _LINE.fullmatch(line)
    if match is None:
        raise SessionError(f"malformed compression line from {who}: {line[:MAX_ANSWER]!r}")
    return match.group(1).decode()


@dataclasses.dataclass
class Tally:
    """Bytes before and after compression, over every connection of a transfer."""

    level: int
    raw: int = 0
    wire: int = 0
    refused: bool = False  # a receiver answered ``none``

    def note(self) -> str:
        """E.g. ``zstd:3 3.41:1 (312 MiB, 327,155,712 bytes on the wire)``."""
        from .progress import size

        if self.refused:
            return "not compressed: the receiver takes no zstd"
        ratio = f"{self.raw / self.wire:.2f}:1" if self.wire else "-"
        return f"zstd:{self.level} {ratio} ({size(self.wire)}, {self.wire:,} bytes on the wire)"


class Compressor:
    """One connection's zstd stream: each write comes out whole, to the end of a block."""

    def __init__(self, tally: Tally) -> None:
        import zstandard

        self._flush = zstandard.COMPRESSOBJ_FLUSH_BLOCK
        self._finish = zstandard.COMPRESSOBJ_FLUSH_FINISH
        self._stream = zstandard.ZstdCompressor(level=tally.level).compressobj()
        self._tally = tally

    def compress(self, data: memoryview) -> bytes:
        out = self._stream.compress(data) + self._stream.flush(self._flush)
        self._tally.raw += len(data)
        self._tally.wire += len(out)
        return out

    def finish(self) -> bytes:
        """The end of the zstd frame."""
        out: bytes = self._stream.flush(self._finish)
        self._tally.wire += len(out)
        return out


class Decompressor:
    """The receiver's side: ``readinto`` fills at most the caller's buffer from what ``recv_into`` brings."""

    def __init__(self, recv_into: Callable[[memoryview], int]) -> None:
        import zstandard

        self._recv_into = recv_into
        self._error = zstandard.ZstdError
        self._scratch = memoryview(bytearray(READ_SIZE))
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
        source = cast("IO[bytes]", self)
        self._reader = decompressor.stream_reader(source, read_size=READ_SIZE, read_across_frames=True, closefd=False)

    def read(self, n: int) -> bytes:
        """What the channel has, for the zstd reader (which calls it)."""
        got = self._recv_into(self._scratch[: min(n, READ_SIZE)])
        return bytes(self._scratch[:got])

    def readinto(self, buf: Any) -> int:
        """Decompressed bytes, at least one unless the sender's stream ended."""
        try:
            return int(self._reader.readinto1(buf))
        except self._error as exc:
            raise SessionError(f"the sender's zstd stream is damaged: {exc}") from None


def offer(channel: Channel, tally: Tally, seconds: float) -> None:
    """Offer zstd on a new ``channel``, and compress from now on when the receiver takes it.

    The answer comes within ``seconds``. A receiver that answers ``none``
    gets the plain bytes; one that refuses (an older sendstream) or says
    nothing is an error that says so.
    """
    from .session.messages import STATUS_PREFIX, parse_status

    channel.set_deadline(time.monotonic() + seconds)
    channel.send_all(offer_line(METHOD))
    got, buf = bytearray(), bytearray(4096)  # it says nothing more until we speak again
    try:
        while b"\n" not in got and len(got) < len(buf):
            n = channel.recv_into(buf)
            if not n:
                break
            got += buf[:n]
    except TimeoutError:
        raise e.RemoteError(
            f"the receiver did not answer the offer to compress within {seconds:g} s "
            "(is it sendstream? --compress needs a sendstream receiver)",
            e.EXIT_IO,
        ) from None
    finally:
        channel.set_deadline(None)
    line = bytes(got).split(b"\n", 1)[0] + b"\n"
    if line.startswith(STATUS_PREFIX):
        code, message = parse_status(line)
        raise e.RemoteError(
            f"the receiver refused to take a compressed stream ({message}); "
            "it may be an older sendstream: send without --compress",
            code or e.EXIT_IO,
        )
    if parse_line(line, "the receiver") == METHOD:
        channel.compress(tally)
    else:
        tally.refused = True
