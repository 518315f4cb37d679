"""What a resumable sender decides across the connections of one transfer, without I/O.

:class:`Resumption` is told what happens: the stream's next bytes
(:meth:`~Resumption.take`, :meth:`~Resumption.hold`), the receiver's answer
to each hello (:meth:`~Resumption.answered`), its acks
(:meth:`~Resumption.acked_to`), a connection lost or failed
(:meth:`~Resumption.lost`, :meth:`~Resumption.failed`). It says what to do:
which bytes to send, from which offset to resend, which checkpoint of an
earlier run to check the stream against, how long to wait before the next
attempt, and when to give up (the refusals: another stream, a receiver ahead
of what was sent, an offset before the token's or no longer held). The
driver (:class:`.sender.SessionSender`) connects, moves bytes and sleeps, so
a test drives a reconnect byte by byte with the machines of
:mod:`.protocol` and no socket.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ResumeError, SessionError
from ..io.retry import Retry
from ..transfer.identity import Identity, describe, stream_identity
from ..transfer.ledger import Checkpoint
from .protocol import PREFIX_SIZE, Answer

WINDOW_SIZE = 64 << 20
PIECE_SIZE = 64 << 10  # the sender holds and waits for acknowledgements in pieces of this size


class Backlog:
    """The bytes taken and not acknowledged yet, held for a resend: stream offsets ``base`` on."""

    def __init__(self, base: int) -> None:
        self.base = base
        self._pieces: deque[bytes] = deque()

    def append(self, piece: bytes) -> None:
        self._pieces.append(piece)

    def drop_before(self, offset: int) -> None:
        """Forget the pieces that end at or before ``offset``."""
        while self._pieces and self.base + len(self._pieces[0]) <= offset:
            self.base += len(self._pieces.popleft())

    def restart(self, offset: int) -> None:
        """Hold nothing; the next piece starts at ``offset``."""
        self._pieces.clear()
        self.base = offset

    def since(self, offset: int) -> Iterator[memoryview]:
        """The bytes held from ``offset`` on."""
        skip = offset - self.base
        for piece in list(self._pieces):
            if skip < len(piece):
                yield memoryview(piece)[skip:]
            skip = max(skip - len(piece), 0)


@dataclass(frozen=True)
class Resume:
    """What to do on a connection the receiver answered: check the stream against ``kept`` (a checkpoint of
    an earlier run the receiver kept) when given, say ``note`` (for -v) when not empty, then send the held
    bytes from ``offset`` on."""

    offset: int
    kept: Checkpoint | None = None
    note: str = ""


@dataclass(frozen=True)
class Wait:
    """Wait ``seconds`` before the next attempt to connect, and tell a person ``notice`` as it begins."""

    seconds: float
    notice: str


def _unexpected(what: str, sent: int | None = None) -> SessionError:
    """The receiver stands where this sender cannot follow: ``what`` it says, and what to do."""
    if sent is None:
        return SessionError(f"the receiver {what}: use the receiver's latest token")
    return SessionError(
        f"the receiver {what} of a transfer and this sender has sent {sent:,}: it is still in an earlier run "
        "of this transfer (or another one). To continue that run give `--resume TOKEN` (the receiver prints it "
        "when it stops, and keeps it in FILE.part.resume); to start over, restart the receiver"
    )


def _out_of_retries(what: str, retries: int, last: BaseException | None) -> SessionError:
    """``what`` happened, and ``retries`` more attempts failed (``last`` the last's error): what to do now."""
    return SessionError(
        f"{what}, and {retries} more attempt{'s' * (retries != 1)} failed; the last: {last}. Try again later "
        "(or with more --retries). A transfer that stopped on the way continues: to a sendstream serve, send the "
        "stream again with --resumable (the service keeps what it got); to a sendstream receive, with "
        "`send --resume TOKEN`, the token it prints when it stops"
    )


class Resumption:
    """One resumable transfer, seen from the sender, across its connections.

    A sender resuming after a restart (``skip_to``, ``stream``: a
    receiver's token) sends only what follows the token's offset, of the
    stream whose identity is ``stream``. ``checks_kept``: the driver can
    check the stream against a checkpoint a receiver kept of an earlier run
    (then, without a token, it skips to it). Every byte after the last
    acknowledged offset is held, up to ``window``; ``retries`` attempts per
    outage, ``retry_delay`` doubling (:class:`~sendstream.io.retry.Retry`).
    """

    def __init__(
        self,
        *,
        skip_to: int = 0,
        stream: Identity | None = None,
        window: int = WINDOW_SIZE,
        retries: int = 5,
        retry_delay: float = 1.0,
        checks_kept: bool = False,
    ) -> None:
        self.skip_to = skip_to  # the receiver had the bytes before this when this sender started
        self._expected = stream
        self.window = max(window, PREFIX_SIZE + PIECE_SIZE)
        self.retry = Retry(retries, retry_delay)
        self._checks_kept = checks_kept
        self.held = Backlog(skip_to)
        self.acked = skip_to  # the receiver's verified offset: everything before it is dropped from memory
        self.written = 0  # stream bytes taken so far
        self.identity: Identity | None = None
        self._prefix = bytearray()
        self.sessions = 0  # connections the receiver answered with an offset
        self.reconnects = 0
        self.resent = 0  # bytes sent more than once
        self._failures = 0  # of the current outage
        self._last: BaseException | None = None
        self._broken: SessionError | None = None

    # the stream

    def take(self, data: bytes) -> bytes:
        """What of ``data``, the stream's next bytes, is to be sent: not what the receiver had before this
        sender started. :meth:`hold` it once it :meth:`fits`."""
        if self.identity is None:
            self._prefix += data[: PREFIX_SIZE - len(self._prefix)]
        if self.written < self.skip_to:
            skip = min(len(data), self.skip_to - self.written)
            self.written += skip
            data = data[skip:]
        return data

    @property
    def known(self) -> bool:
        """The stream's first bytes are all here: its identity can be said (a first connection made)."""
        return self.identity is not None or len(self._prefix) >= PREFIX_SIZE

    @property
    def caught_up(self) -> bool:
        """Every byte the receiver had before this sender started was taken."""
        return self.written >= self.skip_to

    def fits(self, n: int) -> bool:
        """``n`` more bytes may be held (else wait for acks): the window is not full, or nothing is held."""
        return self.written - self.acked + n <= self.window or self.written <= self.acked

    def hold(self, data: bytes) -> None:
        """``data`` (from :meth:`take`) is sent now and held until acknowledged."""
        self.held.append(data)
        self.written += len(data)

    def identify(self) -> Identity:
        """The stream's identity (from what was taken so far, at most its first bytes); ResumeError when it
        is not the stream of the token this sender resumes."""
        if self.identity is None:
            self.identity = stream_identity(bytes(self._prefix))
            self._prefix = bytearray()
            if self._expected is not None and self.identity != self._expected:
                ours, theirs = describe(self.identity), describe(self._expected)
                if ours == theirs:
                    ours += f" whose first {self.identity['prefix']} bytes differ"
                raise ResumeError(f"this is not the stream the resume token is for: {ours}, not {theirs}")
        return self.identity

    # the receiver

    def answered(self, answer: Answer) -> Resume:
        """The receiver's answer to a hello: where to resend from; SessionError when this sender cannot
        follow it (the connection then ends the transfer)."""
        verified, resume = answer.verified, answer.resume
        first = not self.sessions
        kept = not self.skip_to and answer.ledger is not None and self._checks_kept
        checkpoint, note = None, ""
        if resume > self.written and (self.skip_to or kept) and first:
            # a receiver still running got further with the sender before us, or one that kept an
            # earlier run of this transfer: check the stream against it there, and catch up
            if kept:
                assert answer.ledger is not None
                checkpoint = Checkpoint(self.identify(), resume, *answer.ledger)
                note = f"session: the receiver kept {resume} bytes of an earlier run; resuming there"
            self.held.restart(resume)
            self.skip_to = resume
            self.acked = verified
        elif self.skip_to and resume < self.skip_to and first:
            raise _unexpected(f"resumes at offset {resume}, before the token's {self.skip_to}")
        if max(verified, resume) > max(self.written, self.skip_to):
            raise _unexpected(f"already has {max(verified, resume):,} bytes", self.written)
        if first:  # what a receiver had from an earlier run is not sent, nor counted as sent
            self.skip_to = max(self.skip_to, resume)
        self._advance(verified)
        if resume < self.held.base:
            raise SessionError(
                f"the receiver asks to resume at offset {resume}, before offset {self.held.base}, "
                "which is no longer held"
            )
        if not first:
            again = self.written - resume
            self.reconnects, self.resent = self.reconnects + 1, self.resent + again
            note = f"session: receiver verified {verified:,} bytes; resuming at offset {resume} ({again:,} resent)"
        self.sessions += 1
        return Resume(resume, checkpoint, note)

    def acked_to(self, verified: int) -> bool:
        """The receiver verified the stream up to ``verified``: whether held bytes were let go (a writer
        waiting for room may go on); SessionError for an ack of bytes it did not have (sent, or before
        the offset it resumed at)."""
        if verified > max(self.written, self.skip_to):
            raise SessionError(f"the receiver acknowledged {verified} bytes of the {self.written} sent")
        return self._advance(verified)

    def _advance(self, verified: int) -> bool:
        if verified <= self.acked:
            return False
        self.acked = verified
        self.held.drop_before(verified)
        return True

    # connections

    def lost(self, exc: BaseException) -> None:
        """The connection failed with ``exc`` after the answer: a receiver that broke the protocol ends the
        transfer at the next attempt (no reconnect cures it); anything else, a new connection may cure."""
        if isinstance(exc, SessionError):
            self._broken = exc.with_traceback(None)

    def reconnecting(self) -> None:
        """An outage begins (or the first connection): raises why no new connection is tried, when a
        receiver broke the protocol; else each attempt that fails counts until one is answered and sent."""
        if self._broken is not None:
            raise self._broken
        self._failures = 0

    def failed(self, exc: BaseException, *, first: bool) -> Wait:
        """An attempt to connect (and be answered) failed with ``exc``, which a new connection may cure:
        how long to wait before the next; SessionError once ``retries`` attempts of this outage failed.
        ``first``: no connection was ever answered."""
        self._last = exc.with_traceback(None)
        self._failures += 1
        if self._failures > self.retry.retries:
            raise _out_of_retries(
                "no connection" if first else "the connection dropped", self.retry.retries, self._last
            )
        seconds = self.retry.wait(self._failures)
        lost = "no connection" if first else "connection lost"
        return Wait(seconds, f"{lost}; retry {self._failures}/{self.retry.retries} in {seconds:g} s")
