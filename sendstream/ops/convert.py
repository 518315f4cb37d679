"""Rewriting a stream through the encoder, as it is or as a v1 stream (:mod:`.downgrade`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from ..analysis.paths import MAX_NAMES
from ..codec.backend import Backend
from ..codec.encoder import Encoder
from ..codec.events import Restart
from ..errors import UsageError
from ..format.command import Command
from ..io.framed import FramedInput, StreamSource, Warn
from ..io.outputs import atomic_output
from .downgrade import MAX_ZERO_FILL, PARENT_OPTION, Downgrader, ParentSizes, ParentTree

# A parent: a directory (its extraction, or the received subvolume) or its streams, in order.
ParentSource = Sequence[str | os.PathLike[str]]


def directory_sizes(directory: str | os.PathLike[str]) -> ParentSizes:
    """The sizes of the regular files under ``directory`` (the parent's extraction or received subvolume)."""

    def size(path: bytes) -> int | None:
        try:
            st = os.lstat(os.path.join(os.fsencode(directory), path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    return size


def parent_sizes(
    parent: ParentSource,
    *,
    max_names: int = MAX_NAMES,
    max_command_size: int | None = None,
    backend: Backend | None = None,
) -> ParentSizes:
    """The sizes of the parent's files from ``parent``: one directory, or the
    parent's streams (a full stream, then the incrementals on top of it)."""
    if len(parent) == 1 and os.path.isdir(parent[0]):
        return directory_sizes(parent[0])
    if any(os.path.isdir(p) for p in parent):
        raise UsageError(f"{PARENT_OPTION} takes one directory, or stream files only")
    tree = ParentTree(max_names=max_names)
    for source in parent:
        with FramedInput(source, max_command_size=max_command_size, backend=backend) as stream:
            for event in stream.events():
                if isinstance(event, Restart):
                    raise event.error(stream.framer.commands)
                if isinstance(event, Command):
                    tree.feed(event)
    return tree


def convert(
    source: StreamSource,
    target: str,
    *,
    to_version: int | None = None,
    max_zero_fill: int = MAX_ZERO_FILL,
    max_names: int = MAX_NAMES,
    max_command_size: int | None = None,
    warn: Warn | None = None,
    backend: Backend | None = None,
    parent: ParentSource = (),
) -> None:
    """Rewrite the stream at ``source`` into the file ``target`` (``-``: standard output)
    through the encoder; ``target`` appears only when the whole input was read without error.

    As it is, a valid input comes out byte for byte. With ``to_version=1`` it becomes
    a v1 stream (see :class:`~sendstream.ops.downgrade.Downgrader`, which the limits
    are for); what that drops or changes goes to ``warn``, as the input's problems do.
    ``parent`` (see :func:`parent_sizes`) gives the sizes of the parent's files, which
    a hole punched in one of them needs.
    A restarted input is refused: :func:`~sendstream.ops.repair.repair` it first.
    ``backend`` reads and checks (the default one without it).
    """
    if to_version not in (None, 1):
        raise UsageError(f"a stream converts to version 1 only, not {to_version}")
    if parent and to_version is None:
        raise UsageError(f"{PARENT_OPTION} goes with --to-version 1")
    downgrader = None
    if to_version is not None:
        sizes = None
        if parent:
            sizes = parent_sizes(parent, max_names=max_names, max_command_size=max_command_size, backend=backend)
        downgrader = Downgrader(warn=warn, max_zero_fill=max_zero_fill, max_names=max_names, parent=sizes)
    encoder = Encoder()
    with (
        FramedInput(source, max_command_size=max_command_size, warn=warn, backend=backend) as stream,
        atomic_output(target) as out,
    ):
        for event in stream.events(flush_before_read=out):
            if isinstance(event, Restart):
                raise event.error(stream.framer.commands)
            if downgrader is None:
                out.write(encoder.send(event))
            else:
                for converted in downgrader.events(event):
                    out.write(encoder.send(converted))
