"""Apply send streams to a plain directory, in user space (no btrfs needed).

:class:`Extractor` does what ``btrfs receive`` does, command by command and
in stream order, on any Linux file system: the subvolume of a full stream
(SUBVOL) becomes the directory DIR itself, and an incremental stream
(SNAPSHOT) is applied in place onto a DIR that holds the extraction of its
parent. With ``per_subvolume=True`` each subvolume goes to ``DIR/NAME``
instead, as ``btrfs receive DIR`` places it; that is how an input holding
several subvolumes (``btrfs send A B``, with or without ``-e``, or a full
stream and then an incremental of it) is extracted. There an incremental
becomes a new ``DIR/NAME``, as btrfs makes a snapshot: a copy of its parent
(reflinked where the file system can), which is found by the SNAPSHOT's
parent UUID among the subvolumes extracted before it in the input, or among
the clone sources; the parent stays as it was. The copy keeps types, data
and holes, hard links, owners, modes, xattrs, atimes and mtimes, and counts
against ``max_clone_copy`` where it cannot reflink.

Safety: nothing is ever written outside DIR, whatever the stream says.
Every path must be relative and made of plain names (no ``..``, ``.``,
empty or absolute components); every directory on the way is opened
relative to the previous one with ``O_NOFOLLOW | O_DIRECTORY``, so a symlink
anywhere in a path is refused; the last component is acted on with the
``*at`` calls that do not follow symlinks (``renameat``, ``linkat`` without
``AT_SYMLINK_FOLLOW``, ``fchownat``/``utimensat`` with
``AT_SYMLINK_NOFOLLOW``, ``l*xattr``); file data is written only to regular
files opened ``O_PATH | O_NOFOLLOW``, checked, then reopened through
``/proc/self/fd`` (so a fifo or a device node is never opened, and a
symlink never followed). CHMOD of a symlink is refused (chmod follows
symlinks; the kernel never sends it). A clone reads only from DIR or from a
clone-source directory given by the caller, through the same checks.

Errors: every problem raises an :class:`ExtractError` naming the byte
offset, the command index and name, the path and what was expected. All
checks, path resolution and decompression happen before a command changes
anything, so a refused command leaves no trace; only an error of the file
system in the middle of a data command (ENOSPC) can leave that command's
range partly written, as with ``btrfs receive`` (or, per subvolume, the copy
of a SNAPSHOT's parent partly made). Commands before the failing
one stay applied (like ``btrfs receive``, there is no rollback).

Differences from ``btrfs receive``, by design or by necessity:

- no subvolume, no received UUID, no read-only flag: DIR is a plain directory;
- MKFILE refuses an existing name (btrfs-progs ``creat()`` would truncate it,
  or follow a symlink there);
- FILEATTR (inode flags) is ignored, as btrfs-progs 6.2 ignores it;
  UPDATE_EXTENT (``--no-data``) carries no data and is skipped, as there;
- CLONE is a reflink (``FICLONERANGE``) where DIR's file system can, else a
  copy that keeps the source's holes; such copies are bounded: over the
  whole extraction they copy at most ``max_clone_copy`` bytes of data (a
  stream can double a file with each CLONE), and each must fit in the free
  space of DIR's file system, checked before the command writes anything;
- ENCODED_WRITE is always decompressed (zlib, zstd, lzo) and written;
- ENABLE_VERITY is tried with ``FS_IOC_ENABLE_VERITY`` and skipped (reported)
  where the file system refuses;
- when not permitted (not root), device nodes become empty regular files,
  and CHOWN and xattrs the file system refuses (``btrfs.*`` outside btrfs,
  ``trusted.*`` without privilege) are skipped; each skip is reported in
  :attr:`ExtractReport.skipped`;
- a CLONE whose source range starts at or beyond the source's end (``--no-data``
  streams) is skipped with a report, where btrfs receive fails (EINVAL).

Not checked: that DIR (or the directory found) really holds the parent of an
incremental stream, beyond its UUID's name. btrfs
finds the parent by its received UUID; a plain directory has no such record
(keeping one would add a file or an xattr that the subvolume does not have).
Applied to the wrong directory, an incremental fails at the first command
that does not fit, with the commands before it applied. An empty DIR is the
extraction of an empty parent; the incremental may then name nothing of the
parent but its root, and a path that is not there is told as DIR not being
the parent's extraction (see :class:`Extractor`). A clone from the
parent snapshot in place needs an untouched copy of the parent
(``clone_sources``), since DIR has changed; per subvolume, the parent is it.

The package, by responsibility: ``extractor`` (the life cycle and the dispatch
of commands), ``subvolume`` (where a subvolume goes, and its handlers),
``names``, ``metadata`` and ``data`` (the commands by what they touch),
``sources`` (other subvolumes' extractions), ``copy`` (copies of a parent, and
the copy budget), ``tree`` (safe paths and the fd cache), ``syscalls`` (the
system calls that need care) and ``report`` (what an extraction did).
"""

from __future__ import annotations

from .copy import MAX_CLONE_COPY
from .extractor import Extractor, extract_stream
from .report import ExtractReport, Skipped
from .sources import parse_clone_from
from .tree import split_path

__all__ = [
    "MAX_CLONE_COPY",
    "ExtractReport",
    "Extractor",
    "Skipped",
    "extract_stream",
    "parse_clone_from",
    "split_path",
]
