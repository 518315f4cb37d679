"""zstd on the wire: the sender's direction of one connection, compressed before TLS makes its records.

The sender offers (``sendstream-compress zstd``, its first words after the
handshake, :mod:`sendstream.session.offer`) and waits; the receiver answers with the method it takes
(``zstd``, or ``none``), and from then on everything the sender sends on
that connection (a session's hello and frames, or a raw stream) is one zstd
stream. The receiver's direction (answers, acks, the status) stays as it
is. Each write is flushed to the end of a zstd block, so what the sender
has is on the wire at once, as without compression. The two directions are
layers over a channel (:class:`Compressing`, :class:`Decompressing`): the
offer sends on the one it returns, the receiver receives from the one its
inbox holds.

A receiver keeps at most :data:`MAX_WINDOW` of history (levels above
:data:`MAX_LEVEL` need more and are refused at the sender), and decompresses
into the buffer it reads into, never more at once: a crafted stream cannot
make it hold more. A truncated zstd stream is caught where the plain stream
would be (TLS close_notify, the session's end frame, the btrfs END).
"""

from __future__ import annotations

import dataclasses
import inspect
import weakref
from collections.abc import Callable
from typing import IO, Any, cast

from ..errors import SessionError
from .tls.channel import Channel, Wrapping, read_and_send

METHOD = "zstd"
DEFAULT_LEVEL = 3
MAX_LEVEL = 19  # zstd's levels up to 19 keep an 8 MiB window on a stream of unknown size
MAX_WINDOW = 8 << 20
READ_SIZE = 256 << 10


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


@dataclasses.dataclass
class Tally:
    """Bytes before and after compression, over every connection of a transfer."""

    level: int
    raw: int = 0
    wire: int = 0
    refused: bool = False  # a receiver answered ``none``

    def note(self) -> str:
        """E.g. ``zstd:3 3.41:1 (312 MiB, 327,155,712 bytes on the wire)``."""
        from ..transfer.progress import size

        if self.refused:
            return "not compressed: the receiver takes no zstd"
        ratio = f"{self.raw / self.wire:.2f}:1" if self.wire else "-"
        return f"zstd:{self.level} {ratio} ({size(self.wire)}, {self.wire:,} bytes on the wire)"


class Compressing(Wrapping):
    """A layer that sends one zstd stream, counted in ``tally``: every write compressed (a file read and
    compressed: the kernel cannot send it as it is), the end of the frame before the end of the direction."""

    def __init__(self, channel: Channel, tally: Tally) -> None:
        super().__init__(channel)
        self._deflate = Compressor(tally)

    def write(self, view: memoryview) -> None:
        self.inner.write(memoryview(self._deflate.compress(view)))

    def write_file(self, fd: int, offset: int, count: int) -> int:
        return read_and_send(fd, offset, count, self.write)

    def end_tx(self) -> None:
        self.inner.write(memoryview(self._deflate.finish()))
        self.inner.end_tx()


class Decompressing(Wrapping):
    """A layer that takes the peer's bytes as one zstd stream and receives them decompressed."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(channel)
        self._inflate = Decompressor(channel.recv_into)

    def recv_into(self, buf: bytearray | memoryview) -> int:
        return self._inflate.readinto(buf)


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
    """The receiver's side: ``readinto`` fills at most the caller's buffer from what ``recv_into`` (a
    channel's method) brings.

    The zstd reader, a C object, holds its source without telling the garbage collector: a source that
    led back to the channel would make a cycle no collection frees (the channel, its TLS session and the
    decompression window, at every compressed transfer). So the source is a :class:`_Feed` that holds the
    channel's method weakly, and nothing of it holds the reader."""

    def __init__(self, recv_into: Callable[[memoryview], int]) -> None:
        import zstandard

        self._error = zstandard.ZstdError
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
        source = cast("IO[bytes]", _Feed(recv_into))
        self._reader = decompressor.stream_reader(source, read_size=READ_SIZE, read_across_frames=True, closefd=False)

    def readinto(self, buf: Any) -> int:
        """Decompressed bytes, at least one unless the sender's stream ended."""
        try:
            return int(self._reader.readinto1(buf))
        except self._error as exc:
            raise SessionError(f"the sender's zstd stream is damaged: {exc}") from None


class _Feed:
    """What a channel has, for the zstd reader (which calls :meth:`read`); the channel is held weakly."""

    def __init__(self, recv_into: Callable[[memoryview], int]) -> None:
        self._recv_into = weakref.WeakMethod(recv_into) if inspect.ismethod(recv_into) else lambda: recv_into
        self._scratch = memoryview(bytearray(READ_SIZE))

    def read(self, n: int) -> bytes:
        recv_into = self._recv_into()
        if recv_into is None:  # the channel is gone: its stream ended there
            return b""
        got = recv_into(self._scratch[: min(n, READ_SIZE)])
        return bytes(self._scratch[:got])
