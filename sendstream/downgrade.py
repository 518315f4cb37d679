"""Turn a v2 (or v3) send stream into a v1 stream for an older ``btrfs receive``.

Sans-IO: decoder events in, events out; write them with an
:class:`~sendstream.encoder.Encoder`, which encodes DATA with a length in
v1 and computes lengths and CRCs::

    downgrader = Downgrader(warn=print)
    encoder = Encoder()
    for event in file_events(source):
        for out in downgrader.send(event):
            target.write(encoder.send(out))

What changes, command by command (everything else is passed on as it is):

- the stream header says version 1; a v1 input is passed on untouched;
- WRITE: split into WRITEs of at most 48 KiB (``BTRFS_SEND_READ_SIZE``, what
  a v1 kernel sends; v2 sends up to 128 KiB, which does not fit v1's 16-bit
  TLV length);
- ENCODED_WRITE: decompressed (zlib, zstd, lzo; :mod:`sendstream.compression`),
  the bytes ``[unencoded_offset, unencoded_offset + unencoded_file_len)`` of
  the extent written at ``file_offset`` as WRITEs of at most 48 KiB; an
  encrypted extent is an error;
- FALLOCATE: what a v1 kernel sends for the same change. A punched hole or
  a zeroed range becomes WRITEs of zeros (a v1 incremental sends a hole as
  zeros), cut at the file size when the stream shows it (a file created in
  the stream, or after a TRUNCATE) and with KEEP_SIZE; the kernel only
  punches inside the file. Preallocation (mode 0 or KEEP_SIZE alone) reads as
  zeros and changes no content: dropped, or a TRUNCATE when it grows a file
  of known size; dropped with a warning when the size is unknown;
- FILEATTR and ENABLE_VERITY: dropped with a warning (v1 has no way to say
  them; btrfs-progs 6.2 ignores FILEATTR anyway);
- UTIMES keeps OTIME: attribute 12 is part of v1.

Command values of the input are views valid until the next input event;
the commands yielded for one input event must be written before the next
is fed (as the loop above does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import errors as e
from .command import Command
from .compression import MAX_UNENCODED, decompress
from .decoder import StreamHeader
from .dump import escape

__all__ = ["V1_WRITE_SIZE", "DowngradeError", "Downgrader", "downgrade"]

V1_WRITE_SIZE = 48 * 1024  # BTRFS_SEND_READ_SIZE

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10

_ZEROS = bytes(V1_WRITE_SIZE)


class DowngradeError(e.FormatError):
    """A command that cannot be expressed in v1 (encrypted data, bad compressed data)."""

    kind = "cannot downgrade"


class Downgrader:
    """Feed events with :meth:`send`; each call returns the v1 events to write.

    ``warn(message)`` is called for every command dropped or translated
    with a loss; ``warnings`` keeps them all.
    """

    def __init__(self, warn: Callable[[str], None] | None = None, *, max_unencoded: int = MAX_UNENCODED) -> None:
        self._warn_cb = warn
        self.warnings: list[str] = []
        self.max_unencoded = max_unencoded
        self._passthrough = False
        self._sizes: dict[bytes, int] = {}  # file sizes the stream shows, by current path
        self._handlers: dict[str, Callable[[Command], Iterator[Command]]] = {
            "write": self._write,
            "encoded_write": self._encoded_write,
            "fallocate": self._fallocate,
            "fileattr": self._fileattr,
            "enable_verity": self._enable_verity,
        }

    def _warn(self, command: Command, message: str) -> None:
        text = f"offset {command.offset}, command #{command.index} ({command.name}): {message}"
        self.warnings.append(text)
        if self._warn_cb is not None:
            self._warn_cb(text)

    def send(self, event: Any) -> list[Any]:
        """The v1 events for one input event."""
        return list(self.events(event))

    def events(self, event: Any) -> Iterator[Any]:
        """As :meth:`send`, lazily (WRITE data stays a view of the input)."""
        if isinstance(event, StreamHeader):
            self._passthrough = event.version <= 1
            self._sizes.clear()
            yield event if self._passthrough else StreamHeader(event.offset, 1)
            return
        if not isinstance(event, Command) or self._passthrough or event.attributes is None:
            yield event
            return
        handler = self._handlers.get(event.name)
        if handler is None:
            self._track(event)
            yield event
            return
        yield from handler(event)

    # --- size tracking (only what the stream itself shows) -----------------

    def _track(self, cmd: Command) -> None:
        name = cmd.name
        if name in ("subvol", "snapshot"):
            self._sizes.clear()
        elif name == "mkfile":
            self._sizes[bytes(cmd.get("path"))] = 0
        elif name == "truncate":
            self._sizes[bytes(cmd.get("path"))] = int(cmd.get("size"))
        elif name == "rename":
            old, new = bytes(cmd.get("path")), bytes(cmd.get("path_to"))
            size = self._sizes.pop(old, None)
            self._sizes.pop(new, None)
            if size is not None:
                self._sizes[new] = size
            # a renamed directory moves the files under it
            prefix = old + b"/"
            for p in [p for p in self._sizes if p.startswith(prefix)]:
                self._sizes[new + p[len(old) :]] = self._sizes.pop(p)
        elif name in ("unlink", "rmdir"):
            self._sizes.pop(bytes(cmd.get("path")), None)
        elif name == "clone":
            self._grow(bytes(cmd.get("path")), int(cmd.get("file_offset")) + int(cmd.get("clone_len")))

    def _grow(self, path: bytes, end: int) -> None:
        size = self._sizes.get(path)
        if size is not None and end > size:
            self._sizes[path] = end

    # --- commands ------------------------------------------------------------

    def _writes(self, path: bytes, offset: int, data: memoryview | bytes) -> Iterator[Command]:
        mv = memoryview(data)
        for pos in range(0, len(mv), V1_WRITE_SIZE):
            chunk = mv[pos : pos + V1_WRITE_SIZE]
            yield Command.build("write", [("path", path), ("file_offset", offset + pos), ("data", chunk)])
        self._grow(path, offset + len(mv))

    def _write(self, cmd: Command) -> Iterator[Command]:
        data = cmd.get("data")
        if len(data) <= V1_WRITE_SIZE:
            self._grow(bytes(cmd.get("path")), int(cmd.get("file_offset")) + len(data))
            yield cmd
            return
        yield from self._writes(bytes(cmd.get("path")), int(cmd.get("file_offset")), data)

    def _encoded_write(self, cmd: Command) -> Iterator[Command]:
        path = bytes(cmd.get("path"))
        offset = int(cmd.get("file_offset"))
        file_len = int(cmd.get("unencoded_file_len"))
        unencoded_len = int(cmd.get("unencoded_len"))
        unencoded_offset = int(cmd.get("unencoded_offset"))
        if int(cmd.get("encryption", 0)):
            raise DowngradeError(
                "encrypted data cannot be written in v1", offset=cmd.offset, index=cmd.index, command=cmd.name
            )
        if unencoded_len > self.max_unencoded or unencoded_offset + file_len > unencoded_len:
            raise DowngradeError(
                f"bad extent: unencoded_offset {unencoded_offset} + unencoded_file_len {file_len} "
                f"against unencoded_len {unencoded_len} (limit {self.max_unencoded})",
                offset=cmd.offset,
                index=cmd.index,
                command=cmd.name,
            )
        try:
            plain = decompress(int(cmd.get("compression", 0)), cmd.get("data"), unencoded_len)
        except (ValueError, ImportError) as exc:
            raise DowngradeError(
                f"cannot decompress: {exc}", offset=cmd.offset, index=cmd.index, command=cmd.name
            ) from None
        yield from self._writes(path, offset, memoryview(plain)[unencoded_offset : unencoded_offset + file_len])

    def _fallocate(self, cmd: Command) -> Iterator[Command]:
        path = bytes(cmd.get("path"))
        mode = int(cmd.get("fallocate_mode"))
        offset = int(cmd.get("file_offset"))
        end = offset + int(cmd.get("size"))
        size = self._sizes.get(path)
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            if size is not None and mode & FALLOC_FL_KEEP_SIZE:
                end = min(end, size)
            for pos in range(offset, end, V1_WRITE_SIZE):
                n = min(V1_WRITE_SIZE, end - pos)
                yield Command.build("write", [("path", path), ("file_offset", pos), ("data", _ZEROS[:n])])
            if not mode & FALLOC_FL_KEEP_SIZE:
                self._grow(path, end)
            return
        if mode & FALLOC_FL_KEEP_SIZE:
            return  # preallocation only: no visible change
        if size is None:
            self._warn(cmd, f"preallocation up to {end} of a file of unknown size dropped (the size may differ)")
        elif end > size:
            self._sizes[path] = end
            yield Command.build("truncate", [("path", path), ("size", end)])

    def _fileattr(self, cmd: Command) -> Iterator[Command]:
        self._warn(cmd, f"inode flags 0x{int(cmd.get('fileattr')):x} of {_show(cmd)} dropped (no v1 command)")
        return iter(())

    def _enable_verity(self, cmd: Command) -> Iterator[Command]:
        self._warn(cmd, f"fs-verity of {_show(cmd)} dropped (no v1 command)")
        return iter(())


def _show(cmd: Command) -> str:
    return escape(bytes(cmd.get("path"))).decode("utf-8", "replace") or "."


def downgrade(events: Iterable[Any], warn: Callable[[str], None] | None = None) -> Iterator[Any]:
    """The events of ``events`` as a v1 stream; see :class:`Downgrader`."""
    downgrader = Downgrader(warn)
    for event in events:
        yield from downgrader.events(event)
