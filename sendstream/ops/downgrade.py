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
  zeros); with KEEP_SIZE they stop at the size the file has at that point,
  as the kernel only punches inside the file: a WRITE past it would grow
  the file. That size comes from the stream (a file created in it, or
  after a TRUNCATE, and what WRITEs, CLONEs and FALLOCATEs did since) or,
  for a file of the parent snapshot, from ``parent`` (a function from the
  file's path in the parent to its size there, None where there is no
  regular file); without either the command is refused rather than
  guessed. The zeros of a whole run are limited (``max_zero_fill``,
  :data:`MAX_ZERO_FILL` by default): a hole after a TRUNCATE to 2^62 would
  otherwise ask for exabytes. Preallocation (mode 0 or KEEP_SIZE alone)
  reads as zeros and changes no content: dropped, or a TRUNCATE when it
  grows a file of known size; dropped with a warning when the size is
  unknown;
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

from ..analysis.paths import MAX_NAMES, SUBVOLUME, Entry, Inode, PathTracker, limit_error
from ..codec.compression import MAX_UNENCODED, decompress
from ..codec.events import StreamHeader
from ..errors import DowngradeError, shown
from ..format.command import Command

__all__ = ["MAX_ZERO_FILL", "V1_WRITE_SIZE", "DowngradeError", "Downgrader", "ParentSizes", "ParentTree", "downgrade"]

# The size of the regular file at a path of the parent snapshot; None where there is none.
ParentSizes = Callable[[bytes], "int | None"]
# What the option naming the parent is called, for the errors that ask for it.
PARENT_OPTION = "--parent"

V1_WRITE_SIZE = 48 * 1024  # BTRFS_SEND_READ_SIZE

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10

_ZEROS = bytes(V1_WRITE_SIZE)
_U64_END = 1 << 64
# Zeros written for holes over a whole conversion: v1 cannot say "hole", and
# the stream often does not show the file's size. 1 GiB lets the holes of
# ordinary incrementals through (the fixtures' is 32 KiB) and stops a few
# bytes of input from asking for exabytes; a sparse VM image's may need more.
MAX_ZERO_FILL = 1 << 30


class Downgrader:
    """Feed events with :meth:`send`; each call returns the v1 events to write.

    ``warn(message)`` is called for every command dropped or translated
    with a loss; ``warnings`` keeps them all. File sizes are kept on the
    inodes of a :class:`~sendstream.paths.PathTracker` (at most
    ``max_names`` names per subvolume), so a renamed directory takes its
    files' sizes along. Holes become at most ``max_zero_fill`` bytes of
    zeros over the whole run (:class:`~sendstream.errors.LimitExceeded`
    before the command past it is written). ``parent`` gives the sizes of
    the parent snapshot's files, which an incremental stream does not show
    (see the module's FALLOCATE).
    """

    def __init__(
        self,
        warn: Callable[[str], None] | None = None,
        *,
        max_unencoded: int = MAX_UNENCODED,
        max_zero_fill: int = MAX_ZERO_FILL,
        max_names: int = MAX_NAMES,
        parent: ParentSizes | None = None,
    ) -> None:
        self._warn_cb = warn
        self.warnings: list[str] = []
        self.max_unencoded = max_unencoded
        self.max_zero_fill = max_zero_fill
        self.zero_fill = 0  # zero bytes written for holes so far
        self.max_names = max_names
        self._passthrough = False
        self._parent = parent
        self._paths = PathTracker(max_names=max_names)
        self._handlers: dict[str, Callable[[Command, Inode], Iterator[Command]]] = {
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
            self._paths = PathTracker(max_names=self.max_names)
            yield event if self._passthrough else StreamHeader(event.offset, 1)
            return
        if not isinstance(event, Command) or self._passthrough or event.attributes is None:
            yield event
            return
        touched = self._paths.feed(event)
        if touched is None:
            yield event
            return
        inode = touched.entry.inode
        if inode.info is None and self._parent is not None and event.name in _SIZED:
            inode.info = _parent_size(self._parent, inode)
        handler = self._handlers.get(event.name)
        if handler is None:
            track_size(event, inode)
            yield event
            return
        yield from handler(event, inode)

    # --- commands ------------------------------------------------------------

    def _writes(self, cmd: Command, inode: Inode, offset: int, data: memoryview | bytes) -> Iterator[Command]:
        mv = memoryview(data)
        _check_end(cmd, offset, len(mv))
        path = cmd.get("path")
        for pos in range(0, len(mv), V1_WRITE_SIZE):
            chunk = mv[pos : pos + V1_WRITE_SIZE]
            yield Command.build("write", [("path", path), ("file_offset", offset + pos), ("data", chunk)])
        track_size(cmd, inode)

    def _write(self, cmd: Command, inode: Inode) -> Iterator[Command]:
        data = cmd.get("data")
        if len(data) <= V1_WRITE_SIZE:
            track_size(cmd, inode)
            yield cmd
            return
        yield from self._writes(cmd, inode, int(cmd.get("file_offset")), data)

    def _encoded_write(self, cmd: Command, inode: Inode) -> Iterator[Command]:
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
        yield from self._writes(cmd, inode, offset, memoryview(plain)[unencoded_offset : unencoded_offset + file_len])

    def _fallocate(self, cmd: Command, inode: Inode) -> Iterator[Command]:
        path = cmd.get("path")
        mode = int(cmd.get("fallocate_mode"))
        offset = int(cmd.get("file_offset"))
        length = int(cmd.get("size"))
        _check_end(cmd, offset, length)
        end = offset + length
        size: int | None = inode.info
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE):
            if mode & FALLOC_FL_KEEP_SIZE:
                if size is None:
                    raise self._unknown_size(cmd, inode)
                end = min(end, size)
            zeros = max(0, end - offset)
            if self.zero_fill + zeros > self.max_zero_fill:
                raise limit_error(
                    f"a hole of {zeros} bytes becomes WRITEs of zeros in v1: {self.zero_fill + zeros} bytes "
                    f"of zeros in all ({shown(path) or '.'})",
                    self.max_zero_fill,
                    "--max-zero-fill",
                    cmd,
                )
            self.zero_fill += zeros
            for pos in range(offset, end, V1_WRITE_SIZE):
                n = min(V1_WRITE_SIZE, end - pos)
                yield Command.build("write", [("path", path), ("file_offset", pos), ("data", _ZEROS[:n])])
            track_size(cmd, inode)
            return
        if mode & FALLOC_FL_KEEP_SIZE:
            return  # preallocation only: no visible change
        if size is None:
            self._warn(
                cmd,
                f"preallocation up to {end} of a file of unknown size dropped (the size may differ; "
                f"{PARENT_OPTION} gives the sizes of the parent's files)",
            )
        elif end > size:
            if end > _U64_END - 1:  # the range may end at 2^64; a size may not reach it
                raise DowngradeError(
                    f"the preallocation of {offset} + {length} makes the file {end} bytes long, past the "
                    "largest file size",
                    offset=cmd.offset,
                    index=cmd.index,
                    command=cmd.name,
                    expected=f"a size at most {_U64_END - 1}",
                )
            inode.info = end
            yield Command.build("truncate", [("path", path), ("size", end)])

    def _unknown_size(self, cmd: Command, inode: Inode) -> DowngradeError:
        """The refusal of a KEEP_SIZE hole in a file whose size neither the stream nor the parent gives."""
        where = shown(bytes(cmd.get("path"))) or "."
        origin = _origin(inode)
        if self._parent is None:
            why = (
                f"{where} is a file of the parent snapshot, whose size the stream does not show; "
                f"give the parent with {PARENT_OPTION}"
            )
        elif origin is None:
            why = f"{where} was neither made by the stream nor found in the parent"
        else:
            why = f"the parent given with {PARENT_OPTION} has no regular file at {shown(origin) or '.'}"
        return DowngradeError(
            f"a hole punched with KEEP_SIZE stops at the file's end, and {why}",
            offset=cmd.offset,
            index=cmd.index,
            command=cmd.name,
            expected="the file's size",
        )

    def _fileattr(self, cmd: Command, inode: Inode) -> Iterator[Command]:
        self._warn(cmd, f"inode flags 0x{int(cmd.get('fileattr')):x} of {_show(cmd)} dropped (no v1 command)")
        return iter(())

    def _enable_verity(self, cmd: Command, inode: Inode) -> Iterator[Command]:
        self._warn(cmd, f"fs-verity of {_show(cmd)} dropped (no v1 command)")
        return iter(())


# Commands that need or change a file's size: a file of the parent takes its size from there first.
_SIZED = frozenset({"write", "encoded_write", "clone", "fallocate"})


def _parent_size(parent: ParentSizes, inode: Inode) -> int | None:
    """The size in the parent of the file at the path one of ``inode``'s names had there."""
    origin = _origin(inode)
    return None if origin is None else parent(origin)


def _origin(inode: Inode) -> bytes | None:
    """The path in the parent of an entry of ``inode`` (a hard link made by the stream has none)."""
    return next((o for entry in inode.entries if (o := entry.origin) is not None), None)


def track_size(cmd: Command, inode: Inode) -> None:
    """What ``cmd`` does to the size kept on ``inode`` (known sizes only)."""
    name = cmd.name
    if name == "mkfile":
        inode.info = 0
    elif name == "truncate":
        inode.info = int(cmd.get("size"))
    elif name == "clone":
        _grow(inode, int(cmd.get("file_offset")) + int(cmd.get("clone_len")))
    elif name == "write":
        _grow(inode, int(cmd.get("file_offset")) + len(cmd.get("data")))
    elif name == "encoded_write":
        _grow(inode, int(cmd.get("file_offset")) + int(cmd.get("unencoded_file_len")))
    elif name == "fallocate" and not int(cmd.get("fallocate_mode")) & FALLOC_FL_KEEP_SIZE:
        _grow(inode, int(cmd.get("file_offset")) + int(cmd.get("size")))


class ParentTree:
    """The sizes of the files of a parent snapshot, from its streams: feed the
    commands of a full stream and of the incrementals on top of it, in order,
    and call the tree with a path. The subvolume commands after the first are
    the same tree's next state, so they start nothing new."""

    def __init__(self, *, max_names: int = MAX_NAMES) -> None:
        self._paths = PathTracker(max_names=max_names)
        self._started = False

    def feed(self, command: Command) -> None:
        """One command of the parent's streams."""
        if command.name in SUBVOLUME:
            if self._started:
                return
            self._started = True
        touched = self._paths.feed(command)
        if touched is not None:
            track_size(command, touched.entry.inode)

    def __call__(self, path: bytes) -> int | None:
        node: Entry | None = self._paths.root
        for name in path.split(b"/") if path else ():
            node = node.child(name) if node is not None else None
        if node is None or node.is_parent:
            return None
        size: int | None = node.inode.info
        return size


def _grow(inode: Inode, end: int) -> None:
    """A file of known size that now reaches ``end``."""
    if inode.info is not None and end > inode.info:
        inode.info = end


def _check_end(cmd: Command, offset: int, length: int) -> None:
    """The byte range must end where a u64 file offset can still point."""
    if offset + length > _U64_END:
        raise DowngradeError(
            f"the range {offset} + {length} ends past the largest file offset",
            offset=cmd.offset,
            index=cmd.index,
            command=cmd.name,
            expected=f"an end at most {_U64_END}",
        )


def _show(cmd: Command) -> str:
    return shown(bytes(cmd.get("path"))) or "."


def downgrade(
    events: Iterable[Any],
    warn: Callable[[str], None] | None = None,
    *,
    max_zero_fill: int = MAX_ZERO_FILL,
    max_names: int = MAX_NAMES,
    parent: ParentSizes | None = None,
) -> Iterator[Any]:
    """The events of ``events`` as a v1 stream; see :class:`Downgrader`."""
    downgrader = Downgrader(warn, max_zero_fill=max_zero_fill, max_names=max_names, parent=parent)
    for event in events:
        yield from downgrader.events(event)
