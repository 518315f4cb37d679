"""The sans-IO decoder: bytes in, events out.

:class:`Decoder` keeps the input it is fed until a whole event is there
and lets the :class:`~sendstream.codec.framer.Framer` find it; it touches
no file or socket. The events are in :mod:`.events`.
"""

from __future__ import annotations

from .. import errors as e
from .backend import Backend
from .events import NEED_DATA, EndOfInput, Event, NeedData
from .framer import Framer
from .restart import HISTORY


class Decoder:
    """Sans-IO send-stream decoder.

    Feed bytes with :meth:`receive_data` (``b""`` means end of input) and
    call :meth:`next_event` until it returns :data:`NEED_DATA`. Events are
    :class:`~.events.StreamHeader`, :class:`~sendstream.format.command.Command`
    (END included), :class:`~.events.Restart` and, once,
    :class:`~.events.EndOfInput`. Several streams may follow each other.
    ``next_event`` returns an event or raises
    :class:`~sendstream.errors.FormatError`; anything else is a bug. After an
    error the decoder stays failed.

    Memory is bounded: a command header's length is checked against
    ``max_command_size`` (default: the kernel's limit for the stream's
    version) before its payload is waited for. ``backend`` checks the commands
    (:func:`~.backend.default` without it).
    """

    def __init__(
        self,
        *,
        strict: bool = False,
        max_command_size: int | None = None,
        offset: int = 0,
        backend: Backend | None = None,
    ) -> None:
        self._framer = Framer(strict=strict, max_command_size=max_command_size, backend=backend)
        self._data: bytes = b""
        self._mv = memoryview(self._data)
        self._pos = 0
        self._origin = offset  # input offset of _data[0] (or of _pending[0])
        self._pending = bytearray()  # a partial event being completed
        self._need = 0
        self._skip = 0  # where _pending's next event starts, after the kept history
        self._eof = False
        self._error: e.FormatError | None = None
        self._done = False

    @property
    def framer(self) -> Framer:
        """Counters (streams, commands, bytes) and lenient-mode problems."""
        return self._framer

    @property
    def offset(self) -> int:
        """Input offset of the next byte not yet turned into an event."""
        return self._origin + self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof:
            raise e.UsageError("receive_data() after the end of input")
        if not data:
            self._eof = True
            return
        if not self._pending:
            keep = min(self._pos, HISTORY)
            self._pending += self._mv[self._pos - keep :]
            self._origin += self._pos - keep
            self._skip = keep
            self._reset(b"")
        self._pending += data

    def _reset(self, data: bytes) -> None:
        self._data = data
        self._mv = memoryview(data)
        self._pos = 0

    def next_event(self) -> Event | NeedData:
        if self._error is not None:
            raise self._error
        if self._done:
            return NEED_DATA
        if self._pending:
            if len(self._pending) - self._skip < self._need and not self._eof:
                return NEED_DATA
            self._reset(bytes(self._pending))
            self._pos = self._skip
            self._pending.clear()
        try:
            event, pos, need = self._framer.step(self._mv, self._pos, self._eof, self._origin)
        except e.FormatError as exc:
            self._error = exc
            raise
        self._pos = pos
        self._need = need
        if isinstance(event, EndOfInput):
            self._done = True
        return event

    def events(self) -> list[Event]:
        """Every event available now (convenience for tests and small inputs)."""
        out: list[Event] = []
        while not isinstance(ev := self.next_event(), NeedData):
            out.append(ev)
            if isinstance(ev, EndOfInput):
                break
        return out
