"""The receiving end: accept the sender that proves itself, check every command again, write only checked ones.

:func:`accepted` takes the sender and answers it any error; :func:`receive`
writes its stream to a sink (:mod:`sendstream.transfer.sinks`) as :func:`receive_into`
does for every receiver (``sendstream serve``'s stores too), :func:`verify_from_socket`
only checks it.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..codec.framer import Framer
from ..io.windows import file_events
from ..ops.repair import Healer
from ..ops.verify import Report, verify_file
from ..transfer.journal import Chain, after
from ..transfer.progress import Progress, Summary
from ..transport.address import Address, Listening, listen
from ..transport.compression import Decompressing
from ..transport.listener import MAX_PENDING
from ..transport.tls import Channel

if TYPE_CHECKING:
    from ..session.receiver import SessionReceiver
    from ..transfer.journal import Journal
    from ..transfer.ledger import Checkpoint, Ledger
    from ..transfer.sinks import Sink


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
    from ..session.connection import busy_answer
    from ..session.receiver import Opening, SessionReceiver, admit, open_connection
    from ..transport.listener import Listener

    def open_one(sock: socket.socket, deadline: float) -> Opening:
        return open_connection(sock, handshake, deadline, timeout=timeout, idle_timeout=idle_timeout)

    listener = Listener(
        server, open_one, Opening.close, timeout=timeout, log=warn, max_pending=max_pending, busy=busy_answer
    )
    expected = resume.stream if resume else None
    try:
        while True:
            opening = listener.first(lambda o: admit(o, expected))
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
    session: Any,
    write: Callable[[Any], object],
    progress: Progress,
    journal: Journal | None = None,
    ledger: Ledger | None = None,
    replay: Callable[[Any], object] | None = None,
) -> Summary:
    """Receive through a :class:`~sendstream.session.SessionReceiver`: check every command, write only checked ones.

    With a ``journal`` the output is made durable at checkpoints; a resumed
    journal's kept prefix is checked again first (and given to ``replay``,
    when its reader has to see it again), and the session's bytes follow it.
    A ``ledger`` (the journal's own, when there is one) digests every
    command written. The summary counts the bytes this run received; a
    resumed one's :attr:`~Summary.skipped` says where it began.
    """
    from ..transfer.ledger import Ledger

    def counted(data: Any) -> None:
        write(data)
        session.wrote(len(data))

    source: Any = session
    out: Callable[[Any], object] = counted
    resumed = 0  # where this run began: the kept part before it is read again, not received
    if journal is not None:
        journaled = ledger = ledger or Ledger(journal.checkpoint)
        session.checkpoint = lambda offset: journal.commit(offset, session.identity, journaled)
        if journal.checkpoint is not None:
            resumed = journal.offset
            source, out = Chain(journal.prefix(), session), after(resumed, counted, replay)
    healer = Healer(out, ledger=ledger)
    session.progress = progress.add
    for event in file_events(source, Framer(), healer.batch):
        healer.event(event)
    session.commit()
    progress.done()
    channel = session.channel
    compression = "zstd from the sender" if isinstance(channel, Decompressing) else ""
    return Summary(
        progress.bytes,
        progress.seconds,
        channel.describe(),
        healer.restart_count,
        "",
        session.reconnects,
        skipped=resumed,
        compression=compression,
    )


@contextlib.contextmanager
def accepted(
    listening: Listening,
    *,
    warn: Callable[[str], object],
    log: Callable[[str], object] | None = None,
    resume: Checkpoint | None = None,
    announce: Callable[[str], object] | None = None,
) -> Iterator[SessionReceiver]:
    """Listen, and take the first sender that shakes hands and says hello (:func:`accept_sender`).

    On port 0 the system chooses a free port, which ``announce`` hears
    (``listening on HOST:PORT``). Every other connection is refused and named to ``warn``. With
    ``resume`` the session starts where that checkpoint of a stopped
    receiver stands. An error raised inside is answered to the sender before
    it goes on; the session is closed at the end. ``log`` hears which TLS
    path each direction took, and every reconnect.
    """
    from ..session.connection import failure_status

    with listen(listening.address.host, listening.address.port) as server:
        if announce is not None and listening.address.port == 0:
            announce(f"listening on {Address(listening.address.host, server.getsockname()[1]).shown}")
        session = accept_sender(
            server,
            listening.tls.accept,
            timeout=listening.timeout,
            idle_timeout=listening.idle_timeout,
            warn=warn,
            log=log,
            reconnect_timeout=listening.reconnect_timeout,
            resume=resume,
        )
        if log is not None:
            log(session.channel.describe())
        try:
            yield session
        except Exception as exc:
            with contextlib.suppress(Exception):
                session.answer(*failure_status(exc))
            raise
        finally:
            session.close()


def receive_into(session: SessionReceiver, out: Sink, progress: Progress) -> Summary:
    """Check every command of the stream of ``session`` and write only checked ones to ``out`` (entered:
    it completes the output as it is left). On a failure ``out`` hears where the stream stopped, so that its
    journal is durable up to the last command written."""
    session.flush = out.flush
    try:
        return receive_resumable(session, out.write, progress, out.journal, out.ledger, replay=out.replay)
    except BaseException:
        out.stopped(session.written, session.identity, out.ledger)
        raise


def receive(
    listening: Listening,
    sink: Callable[[SessionReceiver], Sink],
    progress: Progress,
    *,
    warn: Callable[[str], object],
    log: Callable[[str], object] | None = None,
    resume: Checkpoint | None = None,
    announce: Callable[[str], object] | None = None,
) -> Summary:
    """Take one sender (:func:`accepted`), check every command, write only checked ones to its sink.

    ``sink(session)`` makes the sink once the sender is there (a raw stream
    cannot keep a journal); it is completed before the sender hears success. A transfer that fails
    leaves a journal durable up to the last command written.
    """
    with accepted(listening, warn=warn, log=log, resume=resume, announce=announce) as session:
        progress.start()
        with sink(session) as out:
            summary = receive_into(session, out, progress)
        if out.journal is not None:
            session.verified = session.written  # the whole stream is durable now
        session.answer(0, "ok", linger=listening.linger)
    return summary


def verify_from_socket(
    listening: Listening,
    *,
    warn: Callable[[str], object],
    log: Callable[[str], object] | None = None,
    keep_going: bool = False,
    max_command_size: int | None = None,
    announce: Callable[[str], object] | None = None,
) -> Report:
    """Take one sender (:func:`accepted`) and check what it sends; it hears the first problem, or success."""
    with accepted(listening, warn=warn, log=log, announce=announce) as session:
        report = verify_file(session, keep_going=keep_going, max_command_size=max_command_size)  # type: ignore[arg-type]
        first = report.problems[0] if report.problems else None
        session.answer(report.exit_code, str(first) if first else "ok")
    return report
