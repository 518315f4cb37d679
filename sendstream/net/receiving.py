"""The receiving end: accept the sender that proves itself, check every command again, write only checked ones."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..codec.decoder import Framer
from ..io.windows import file_events
from ..ops.repair import Healer
from .journal import Chain, after
from .listener import MAX_PENDING
from .progress import Progress, Summary
from .tls import Channel

if TYPE_CHECKING:
    from ..ops.ledger import Checkpoint
    from .journal import Journal
    from .session.receiver import SessionReceiver


def accept_sender(
    server: socket.socket,
    handshake: Callable[[socket.socket, float], Channel],
    *,
    timeout: float,
    idle_timeout: float | None,
    warn: Callable[[str], object],
    log: Callable[[str], object] | None = None,
    reconnect_timeout: float | None = None,
    resume: Checkpoint | None = None,
    max_pending: int = MAX_PENDING,
) -> SessionReceiver:
    """The session of the first connection to ``server`` that shakes hands and says hello, or sends a raw stream.

    ``handshake(sock, seconds)`` makes the channel of an accepted socket
    (:func:`~sendstream.tls.accept_channel`). Connections are opened
    concurrently by a :class:`~sendstream.listener.Listener`, each within
    ``timeout`` seconds of its accept; every one that fails is refused and
    named to ``warn``, and the wait goes on for ever. Once open, each read
    of the transfer waits at most ``idle_timeout``. With
    ``reconnect_timeout`` the sender may reconnect after a drop; with
    ``resume`` only a session of that checkpoint's stream is taken, and it
    starts at the checkpoint's offset.
    """
    from .listener import Listener
    from .session.receiver import Opening, SessionReceiver, admit, open_connection

    def open_one(sock: socket.socket, deadline: float) -> Opening:
        return open_connection(sock, handshake, deadline, timeout=timeout, idle_timeout=idle_timeout)

    listener = Listener(server, open_one, Opening.close, timeout=timeout, log=warn, max_pending=max_pending)
    expected = resume.stream if resume else None
    try:
        while True:
            opening = listener.first((lambda o: admit(o, expected)) if expected is not None else None)
            try:
                session = SessionReceiver(
                    opening,
                    listener=listener if reconnect_timeout is not None else None,
                    reconnect_timeout=reconnect_timeout or 0.0,
                    log=log,
                    start=resume.offset if resume else 0,
                    identity=expected,
                )
            except Exception as exc:  # the answer to its hello could not be sent: that connection is gone
                opening.close()
                warn(f"the connection that opened first failed: {exc}")
                continue
            if reconnect_timeout is None:
                listener.close()
            return session
    except BaseException:
        listener.close()
        raise


def receive_resumable(
    session: Any, write: Callable[[Any], object], progress: Progress, journal: Journal | None = None
) -> Summary:
    """Receive through a :class:`~sendstream.session.SessionReceiver`: check every command, write only checked ones.

    With a ``journal`` the output is made durable at checkpoints; a resumed
    journal's kept prefix is checked again first, and the session's bytes
    follow it.
    """
    from ..ops.ledger import Ledger

    def counted(data: Any) -> None:
        write(data)
        session.wrote(len(data))

    source: Any = session
    out: Callable[[Any], object] = counted
    ledger = None
    if journal is not None:
        ledger = Ledger(journal.checkpoint)
        session.checkpoint = lambda offset: journal.commit(offset, session.identity, ledger)
        if journal.checkpoint is not None:
            source, out = Chain(journal.prefix(), session), after(journal.offset, counted)
    healer = Healer(out, ledger=ledger)
    session.progress = progress.add
    for event in file_events(source, Framer(), healer.batch):
        healer.event(event)
    session.commit()
    progress.done()
    return Summary(
        progress.bytes, progress.seconds, session.channel.describe(), healer.restart_count, "", session.reconnects
    )
