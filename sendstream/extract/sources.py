"""Where the extractions of other subvolumes are, for a CLONE's source or a
SNAPSHOT's parent: given by the caller, or extracted before in the input."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from uuid import UUID

from ..errors import CloneSourceMissing, UsageError
from .report import Subvolume, show
from .tree import COPY_CACHE, DIR_FLAGS, Tree

__all__ = ["CloneSources", "clone_from_hint", "parse_clone_from"]

_SOURCES_OPEN = 8  # clone sources kept open at once


def parse_clone_from(values: Iterable[str]) -> tuple[dict[UUID, str], list[str]]:
    """``--clone-from`` values: ``UUID=DIR`` maps one subvolume, a plain ``DIR``
    holds extractions in subdirectories named by UUID. Returns both kinds.
    Every directory must exist (:class:`~sendstream.errors.UsageError` naming the
    value otherwise); a value whose part before ``=`` is no UUID is a plain DIR
    only where that directory exists (``=DIR``, an empty UUID, is an error)."""
    sources: dict[UUID, str] = {}
    dirs: list[str] = []
    for value in values:
        head, sep, tail = value.partition("=")
        try:
            key = UUID(head) if sep else None
        except ValueError:
            key = None
        where = value if key is None else tail
        if not os.path.isdir(where):
            if key is not None:
                why = f"{where!r} is not a directory" if where else "no directory after '='"
            elif sep:
                why = f"{head!r} is not a UUID (UUID=DIR), and there is no directory {value!r}"
            else:
                why = "not a directory"
            raise UsageError(f"--clone-from {value!r}: {why}")
        if key is None:
            dirs.append(value)
        else:
            sources[key] = tail
    return sources, dirs


def clone_from_hint(uuid: UUID) -> str:
    """How to give the extraction of subvolume ``uuid``, for an error's ``expected``."""
    return f"--clone-from {uuid}=DIR, or a --clone-from DIR holding a directory named {uuid}"


class CloneSources:
    """The extractions of subvolumes other than the current one.

    ``clone_sources`` maps a UUID to the directory of its extraction; each of
    ``clone_dirs`` may hold extractions in subdirectories named by UUID; per
    subvolume, :meth:`remember` adds each subvolume extracted into DIR/NAME
    (``dest_fd`` is DIR). The trees of clone sources stay open, at most
    ``_SOURCES_OPEN``, the least recently used closed first.
    """

    def __init__(
        self,
        dest_fd: int,
        clone_sources: Mapping[UUID, str],
        clone_dirs: Sequence[str],
        *,
        per_subvolume: bool,
    ) -> None:
        self._dest_fd = dest_fd
        self._given = dict(clone_sources)
        self._dirs = list(clone_dirs)
        self._per_subvolume = per_subvolume
        self._extracted: dict[UUID, Subvolume] = {}  # per subvolume: the last extracted of each UUID
        self._open: dict[UUID, Tree] = {}  # open clone sources, the most recently used last

    def remember(self, subvolume: Subvolume) -> None:
        """``subvolume`` is extracted in DIR/NAME (per subvolume)."""
        self._extracted[subvolume.uuid] = subvolume

    def extracted(self, uuid: UUID) -> bool:
        """Whether subvolume ``uuid`` was extracted in DIR (ours to keep as it was), not given."""
        return uuid in self._extracted

    def find(self, uuid: UUID) -> tuple[int, str] | None:
        """An O_PATH fd and the place of an extraction of subvolume ``uuid``: extracted
        before in this input (DIR/NAME, per subvolume), or given as a clone source.
        None when there is none."""
        sub = self._extracted.get(uuid)
        if sub is not None:
            return os.open(sub.path, DIR_FLAGS, dir_fd=self._dest_fd), sub.directory
        where = self._given.get(uuid)
        if where is not None:
            return os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), where
        for d in self._dirs:
            base = os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                return os.open(str(uuid), DIR_FLAGS, dir_fd=base), os.path.join(d, str(uuid))
            except FileNotFoundError:
                continue
            finally:
                os.close(base)
        return None

    def tree(self, uuid: UUID, path: bytes, parent: UUID | None) -> Tree:
        """The tree of the clone source ``uuid`` (named ``path`` by the CLONE) for a
        subvolume whose parent is ``parent``; :class:`CloneSourceMissing` without one."""
        tree = self._open.pop(uuid, None)
        if tree is not None:
            self._open[uuid] = tree  # the most recently used last
            return tree
        found = self.find(uuid)
        if found is None:
            if uuid == parent and not self._per_subvolume:
                raise CloneSourceMissing(
                    f"the clone source is the parent snapshot {uuid} (path '{show(path)}'), which "
                    "the extraction has changed in place",
                    expected=f"an untouched extraction of the parent: {clone_from_hint(uuid)}",
                )
            raise CloneSourceMissing(
                f"subvolume {uuid} (path '{show(path)}') was not given", expected=clone_from_hint(uuid)
            )
        fd, where = found
        if len(self._open) >= _SOURCES_OPEN:  # each keeps fds: close the least recently used
            self._open.pop(next(iter(self._open))).close()
        tree = self._open[uuid] = Tree(fd, f"clone source {where}", COPY_CACHE)
        return tree

    def trim(self) -> None:
        """Between commands: close what the open trees no longer need (:meth:`Tree.trim`)."""
        for tree in self._open.values():
            tree.trim()

    def close(self) -> None:
        for tree in self._open.values():
            tree.close()
        self._open.clear()
