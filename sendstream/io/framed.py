"""A stream read through a framer, its problems told to the caller: what every stream operation shares.

An operation (dump, convert, repair, extract, ...) takes its input as a
:data:`StreamSource`, reads it in a :class:`FramedInput` and hands the
problems the framer found (well-formed but doubtful commands) to a ``warn``
callback, one message each.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import BinaryIO

from .. import errors as e
from ..codec.backend import Backend
from ..codec.events import Event
from ..codec.framer import Framer
from ..codec.scan import Batch
from .windows import file_events, open_input

# A path (``-`` is standard input) or an open binary file (left open).
StreamSource = str | os.PathLike[str] | BinaryIO
# Hears one message per problem (without "warning:"; the caller says how it is shown).
Warn = Callable[[str], None]


@contextlib.contextmanager
def opened(source: StreamSource) -> Iterator[BinaryIO]:
    """``source`` as a binary file: a path opened (and closed after), a file as it is."""
    if isinstance(source, str | os.PathLike):
        with open_input(os.fspath(source)) as f:
            yield f
    else:
        yield source


def tell_problems(
    problems: e.ProblemLog, tell: Warn, told: int = 0, *, final: bool = True, skip: tuple[type, ...] = ()
) -> int:
    """Tell the kept problems from ``told`` on (not those of the ``skip`` types); when
    ``final``, how many more there were. Returns how many are told now."""
    for problem in problems[told:]:
        if not isinstance(problem, skip):
            tell(str(problem))
    if final and problems.dropped:
        tell(f"{problems.dropped} more problems not shown")
    return len(problems)


class FramedInput:
    """One input read through a :class:`~sendstream.codec.decoder.Framer`.

    As a context manager it opens ``source``; when its block ends without an
    error, it tells ``warn`` (if given) every problem not told yet, except
    those of the ``skip`` types, and how many more there were. ``backend``
    reads and checks (the default one without it).
    """

    def __init__(
        self,
        source: StreamSource,
        *,
        strict: bool = False,
        max_command_size: int | None = None,
        warn: Warn | None = None,
        skip: tuple[type, ...] = (),
        backend: Backend | None = None,
    ) -> None:
        self.framer = Framer(strict=strict, max_command_size=max_command_size, backend=backend)
        self._warn = warn
        self._skip = skip
        self._told = 0
        self._opened = opened(source)

    def __enter__(self) -> FramedInput:
        self.file = self._opened.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._opened.__exit__(kind, exc, tb)
        if kind is None:
            self.tell(final=True)

    def events(self, batch: Batch | None = None, *, flush_before_read: BinaryIO | None = None) -> Iterator[Event]:
        """Every event of the input (see :func:`~sendstream.io.windows.file_events`); with
        ``flush_before_read``, that output is flushed whenever a read of a pipe might wait."""
        flush = None if flush_before_read is None else flush_before_read.flush
        return file_events(self.file, self.framer, batch, before_read=flush)

    def tell(self, *, final: bool = False) -> None:
        """Tell ``warn`` the problems found since the last time; when ``final``, how many more there were."""
        problems = self.framer.problems
        if self._warn is not None and (final or len(problems) > self._told):
            self._told = tell_problems(problems, self._warn, self._told, final=final, skip=self._skip)
