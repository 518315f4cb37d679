"""Relaying a stream from one network leg to another, checking and healing every command in between.

The upstream leg is what ``sendstream receive`` accepts: a
:class:`~sendstream.session.receiver.SessionReceiver` (a session that
survives drops, or a raw stream). Every command is checked, and a restarted
stream healed, on the batch path of ``receive``
(:func:`~sendstream.endpoints.receiving.receive_resumable`) before it is handed
downstream: nothing unverified leaves. The downstream leg sends as
``sendstream send`` does: the plain stream through one channel
(:class:`~sendstream.endpoints.sending.PlainSender`), or a
:class:`~sendstream.session.sender.SessionSender` that reconnects. Each
leg has its own channel, so its own TLS mode and key.

:func:`relay` takes the sender and answers it with the downstream result:
:func:`relay_stream` returns only once the downstream receiver reported
success; a downstream failure raises :class:`DownstreamFailed` with the
downstream receiver's message and exit code. A byte is acknowledged upstream
once it is handed downstream (sent, or held in the session sender's window),
so memory stays at the upstream input window plus that window (64 MiB).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .. import errors as e
from ..errors import DownstreamFailed
from ..session.receiver import SessionReceiver
from ..session.resume import WINDOW_SIZE
from ..session.sender import SessionSender
from ..transfer.progress import Progress, Summary
from ..transport.address import Listening
from ..transport.tls import Channel
from .receiving import accepted, receive_resumable
from .sending import PlainSender


class Downstream(Protocol):
    """A sending leg: a :class:`~sendstream.transport.PlainSender` or a :class:`~sendstream.session.SessionSender`."""

    describe: str

    @property
    def reconnects(self) -> int: ...

    @property
    def resent(self) -> int: ...

    def write(self, data: Any) -> None: ...

    def finish(self) -> tuple[int, str]: ...

    def abort(self, reason: str | None = None) -> None: ...


@contextlib.contextmanager
def _downstream_errors() -> Iterator[None]:
    """Name a failure of the downstream leg as such, keeping its exit code."""
    try:
        yield
    except DownstreamFailed:
        raise
    except (e.SendStreamError, OSError) as exc:
        code = exc.exit_code if isinstance(exc, e.SendStreamError) else e.EXIT_IO
        raise DownstreamFailed(f"downstream: {exc}", code) from exc


def relay_stream(
    session: SessionReceiver,
    connect: Callable[[], Channel],
    progress: Progress,
    *,
    resumable: bool = False,
    retries: int = 5,
    retry_delay: float = 1.0,
    window: int = WINDOW_SIZE,
    log: Callable[[str], object] | None = None,
) -> Summary:
    """Check and heal every command ``session`` brings and send it on through ``connect()``'s channels.

    Returns once the downstream receiver reported success. On an upstream
    error the downstream leg is aborted (a session sender tells its receiver
    why) and the error raised; on a downstream one, :class:`DownstreamFailed`.
    """
    downstream: Downstream
    with _downstream_errors():
        if resumable:
            downstream = SessionSender(
                connect, retries=retries, retry_delay=retry_delay, window=window, log=log, notice=progress.note
            )
        else:
            downstream = PlainSender(connect())

    def write(data: Any) -> None:
        with _downstream_errors():
            downstream.write(data)

    try:
        summary = receive_resumable(session, write, progress)
        with _downstream_errors():
            code, message = downstream.finish()
    except BaseException as exc:
        upstream_error = isinstance(exc, e.SendStreamError) and not isinstance(exc, DownstreamFailed)
        with contextlib.suppress(Exception):
            downstream.abort(str(exc) if upstream_error else None)
        raise
    if code:
        raise DownstreamFailed(f"downstream: the receiver failed: {message}", code)
    summary.seconds = progress.seconds
    summary.path = f"upstream: {summary.path}; downstream: {downstream.describe}"
    summary.reconnects += downstream.reconnects
    summary.resent = downstream.resent
    return summary


def relay(
    listening: Listening,
    connect: Callable[[], Channel],
    progress: Progress,
    *,
    warn: Callable[[str], object],
    upstream_log: Callable[[str], object] | None = None,
    resumable: bool = False,
    retries: int = 5,
    retry_delay: float = 1.0,
    log: Callable[[str], object] | None = None,
    announce: Callable[[str], object] | None = None,
) -> Summary:
    """Take one sender (:func:`~sendstream.endpoints.receiving.accepted`) and relay its stream (:func:`relay_stream`).

    The sender hears success once the downstream receiver reported it, and
    the failure of either leg otherwise. ``warn`` and ``upstream_log`` hear
    about the upstream leg, ``log`` about the downstream one.
    """
    with accepted(listening, warn=warn, log=upstream_log, announce=announce) as session:
        progress.start()
        summary = relay_stream(
            session, connect, progress, resumable=resumable, retries=retries, retry_delay=retry_delay, log=log
        )
        session.answer(0, "ok", linger=listening.linger)
    return summary
