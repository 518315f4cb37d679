"""The commands that change a file's data: WRITE, ENCODED_WRITE, CLONE, TRUNCATE,
FALLOCATE, UPDATE_EXTENT."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from ..codec.compression import decompress
from ..errors import ApplyError, BadCommand
from ..format.command import Command
from .copy import CopyBudget
from .report import ExtractReport, Skip, Subvolume, show
from .sources import CloneSources
from .syscalls import (
    FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_PUNCH_HOLE,
    FALLOC_FL_ZERO_RANGE,
    copy_range,
    data_ranges,
    fallocate,
    free_space,
    pwrite_all,
    reflink,
)
from .tree import Tree, path_of

__all__ = ["DataHandlers"]

_OFF_MAX = (1 << 63) - 1
# The fallocate modes accepted: those the kernel sends, and ZERO_RANGE.
_FALLOC_ALLOWED = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE


def _offsets(cmd: Command, *keys: str) -> list[int]:
    """The values of ``keys``, each and their sum a file offset (below 2**63)."""
    values = [int(cmd.get(k)) for k in keys]
    for k, v in zip(keys, values, strict=True):
        if v > _OFF_MAX:
            raise BadCommand(f"{k} {v} is out of range", expected=f"at most {_OFF_MAX}")
    if sum(values) > _OFF_MAX:
        raise BadCommand(f"{' + '.join(keys)} is out of range", expected=f"at most {_OFF_MAX}")
    return values


class DataHandlers:
    """The data commands of one subvolume (``subvolume``, extracted in ``tree``).

    Data goes only into regular files (:meth:`Tree.open_regular`); the file
    written stays open across consecutive data commands on it, until
    :meth:`stop_writing`. A CLONE reads from ``tree`` or from ``sources``;
    where it cannot reflink it copies, within ``budget``. ``max_unencoded``
    bounds an ENCODED_WRITE's decompressed size.
    """

    def __init__(
        self,
        tree: Tree,
        subvolume: Subvolume,
        *,
        sources: CloneSources,
        budget: CopyBudget,
        report: ExtractReport,
        skip: Skip,
        max_unencoded: int,
    ) -> None:
        self._tree = tree
        self._subvolume = subvolume
        self._sources = sources
        self._budget = budget
        self._report = report
        self._skip = skip
        self._max_unencoded = max_unencoded
        self._writing: tuple[tuple[bytes, ...], int] | None = None
        # The commands it applies, by name.
        self.handlers: dict[str, Callable[[Command], None]] = {
            "write": self.write,
            "encoded_write": self.encoded_write,
            "clone": self.clone,
            "truncate": self.truncate,
            "fallocate": self.fallocate,
            "update_extent": self.update_extent,
        }

    def stop_writing(self) -> None:
        """Close the file kept open for writing, if any."""
        if self._writing is not None:
            os.close(self._writing[1])
            self._writing = None

    def _writable(self, parts: tuple[bytes, ...]) -> int:
        """The open write fd of the regular file ``parts`` (kept across data commands)."""
        if self._writing is not None and self._writing[0] == parts:
            return self._writing[1]
        self.stop_writing()
        fd = self._tree.open_regular(parts, os.O_WRONLY | os.O_NONBLOCK, "file to write")
        self._writing = (parts, fd)
        return fd

    def write(self, cmd: Command) -> None:
        parts = path_of(cmd, root_ok=False)
        data = cmd.get("data")
        (offset,) = _offsets(cmd, "file_offset")
        if offset + len(data) > _OFF_MAX:
            raise BadCommand("the write ends beyond the largest file offset")
        pwrite_all(self._writable(parts), memoryview(data), offset)
        self._report.data_bytes += len(data)

    def encoded_write(self, cmd: Command) -> None:
        parts = path_of(cmd, root_ok=False)
        offset, file_len = _offsets(cmd, "file_offset", "unencoded_file_len")
        unencoded_len = int(cmd.get("unencoded_len"))
        unencoded_offset = int(cmd.get("unencoded_offset"))
        compression = int(cmd.get("compression", 0))
        encryption = int(cmd.get("encryption", 0))
        if encryption:
            raise BadCommand("encrypted data is not supported", expected="encryption 0", actual=encryption)
        if unencoded_len > self._max_unencoded:
            raise BadCommand(
                f"unencoded_len {unencoded_len} is over the limit", expected=f"at most {self._max_unencoded}"
            )
        if unencoded_offset + file_len > unencoded_len:
            raise BadCommand(
                "unencoded_offset + unencoded_file_len is beyond unencoded_len",
                expected=f"at most {unencoded_len}",
                actual=unencoded_offset + file_len,
            )
        try:
            plain = decompress(compression, cmd.get("data"), unencoded_len)
        except (ValueError, ImportError) as exc:
            raise BadCommand(f"cannot decompress: {exc}", expected="valid compressed data") from None
        fd = self._writable(parts)
        pwrite_all(fd, memoryview(plain)[unencoded_offset : unencoded_offset + file_len], offset)
        self._report.data_bytes += file_len

    def truncate(self, cmd: Command) -> None:
        parts = path_of(cmd, root_ok=False)
        (size,) = _offsets(cmd, "size")
        os.ftruncate(self._writable(parts), size)

    def fallocate(self, cmd: Command) -> None:
        parts = path_of(cmd, root_ok=False)
        mode = int(cmd.get("fallocate_mode"))
        offset, size = _offsets(cmd, "file_offset", "size")
        if mode & ~_FALLOC_ALLOWED:
            raise BadCommand(f"fallocate mode 0x{mode:x}", expected="KEEP_SIZE, PUNCH_HOLE or ZERO_RANGE flags")
        fd = self._writable(parts)
        # ext4 keeps what it allocated before ENOSPC: 40 bytes of stream would fill the disk.
        if not mode & FALLOC_FL_PUNCH_HOLE and size > (free := free_space(fd)):
            raise ApplyError(
                f"fallocate of {size} bytes does not fit in the free space of the file system ({free} bytes)",
                errno=errno.ENOSPC,
            )
        fallocate(fd, mode, offset, size)

    def update_extent(self, cmd: Command) -> None:
        path_of(cmd, root_ok=False)
        self._skip(cmd, bytes(cmd.get("path")), "no file data in the stream (btrfs send --no-data)")

    def clone(self, cmd: Command) -> None:
        parts = path_of(cmd, root_ok=False)
        src_parts = path_of(cmd, "clone_path", root_ok=False)
        offset, length, src_offset = _offsets(cmd, "file_offset", "clone_len", "clone_offset")
        if src_offset + length > _OFF_MAX or offset + length > _OFF_MAX:
            raise BadCommand("the clone range is out of range", expected=f"offsets at most {_OFF_MAX}")
        tree = self._clone_source(cmd)
        src = tree.open_regular(src_parts, os.O_RDONLY | os.O_NOATIME | os.O_NONBLOCK, "clone source")
        try:
            dst = self._writable(parts)
            sst, dstat = os.fstat(src), os.fstat(dst)
            size = sst.st_size
            if src_offset >= size:
                # The kernel refuses this (EINVAL, and btrfs receive stops); it happens in
                # --no-data streams, whose files have no size: extract what can be.
                self._skip(
                    cmd,
                    bytes(cmd.get("path")),
                    f"clone source '{show(bytes(cmd.get('clone_path')))}' is {size} bytes long, the range starts "
                    f"at {src_offset}: nothing to clone (btrfs receive fails here)",
                )
                return
            # As the kernel's remap checks: the range is cut at the source's end (0: up to it).
            length = size - src_offset if length == 0 else min(length, size - src_offset)
            if (sst.st_dev, sst.st_ino) == (dstat.st_dev, dstat.st_ino) and (
                src_offset < offset + length and offset < src_offset + length
            ):
                raise BadCommand("the clone range overlaps its source in the same file", expected="separate ranges")
            if not reflink(src, src_offset, length, dst, offset):
                need = sum(end - start for start, end in data_ranges(src, src_offset, src_offset + length))
                self._budget.allow(need, f"the clone of {length} bytes into '{show(b'/'.join(parts))}'", dst, cmd)
                self._budget.spend(copy_range(src, src_offset, length, dst, offset))
            self._report.data_bytes += length
        finally:
            os.close(src)

    def _clone_source(self, cmd: Command) -> Tree:
        """The tree a CLONE reads from: this subvolume's own, or a clone source's."""
        uuid = cmd.get("clone_uuid")
        if uuid == self._subvolume.uuid:
            return self._tree
        return self._sources.tree(uuid, bytes(cmd.get("clone_path")), self._subvolume.parent_uuid)
