"""``sendstream serve``: one process takes streams from many clients at once, each into its own place.

Connections are opened concurrently (:class:`~sendstream.net.listener.Listener`):
a wrong key, garbage or silence ends that connection with a logged reason.
Each opened connection runs in a thread of its own: the client is the PSK
identity the handshake proved, its place the one the configuration gives it.
Every command is checked (and a restarted stream healed) before it is
written; the stream goes to a hidden file in the client's place, and only a
whole, checked stream is renamed to its name (:mod:`sendstream.ops.stored`),
with its manifest beside it. A failure of one transfer is answered to its
sender and logged; the service goes on.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import select
import shlex
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from typing import IO, Any

from .. import errors as e
from ..archive.store import Location, connect
from ..archive.upload import upload
from ..io.outputs import OutputDirectory, OutputFile
from ..io.threads import started
from ..net.address import listen
from ..net.journal import PART_SUFFIX, Journal
from ..net.listener import Listener, describe_peer
from ..net.progress import NONE, Progress
from ..net.receiving import receive_resumable
from ..net.session.connection import failure_status, tell
from ..net.session.protocol import PREFIX_SIZE, listed_line, status_line
from ..net.session.receiver import Opening, SessionReceiver, open_connection
from ..net.sinks import ChildSink
from ..net.tls import Channel, PlainChannel, accept_channel
from ..net.tls.keys import fingerprint
from ..ops.identity import snapshot_name, stream_identity
from ..ops.ledger import Checkpoint, Ledger
from ..ops.stored import Unnamed, manifest, stream_name
from .config import Client, Config
from .confine import UuidGuard, leftover
from .held import held
from .journals import Charge, Quota, expired, incoming_name, kept, remove
from .metrics import Metrics, NoMetrics

DRAIN_SECONDS = 30.0  # after SIGTERM, how long running transfers may take to end before they are cut
SWEEP_SECONDS = 3600.0  # how often the places are searched for expired journals (and once at start)


class EventLog:
    """One line per event, plain ``key=value`` text or JSON lines, safe from every thread; a value that is
    no printable text (a name: any bytes) is escaped (:func:`~sendstream.errors.escaped`)."""

    def __init__(self, stream: IO[str], fmt: str = "text") -> None:
        self._stream = stream
        self._json = fmt == "json"
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        when = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
        if self._json:
            shown = {k: e.escaped(v) if isinstance(v, str) else v for k, v in fields.items()}
            line = json.dumps({"time": when, "event": event, **shown}, sort_keys=False)
        else:
            line = " ".join([when, event, *(f"{k}={_text(v)}" for k, v in fields.items())])
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _text(value: Any) -> str:
    text = e.escaped(str(value))
    return json.dumps(text) if not text or any(c.isspace() or c in '"=' for c in text) else text


class Service:
    """The service of ``config``: :meth:`run` until ``stop`` is set."""

    def __init__(
        self,
        config: Config,
        log: EventLog,
        metrics: Metrics | NoMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.log = log
        self.metrics = metrics or NoMetrics()
        self.clock = clock  # the wall clock journals expire by
        self._quotas = {name: Quota(c) for name, c in config.clients.items() if c.quota is not None}
        self._lock = threading.Lock()
        self._active: dict[str, set[SessionReceiver]] = {name: set() for name in config.clients}
        self._threads: set[threading.Thread] = set()
        self._s3: Any = None
        self._claims: dict[str, str] = {}  # what running transfers make: subvolume UUIDs, subvolumes, journals

    def run(self, stop: threading.Event) -> None:
        """Accept and serve until ``stop``; then let running transfers end (at most :data:`DRAIN_SECONDS`)."""
        config = self.config
        for client in config.clients.values():
            kind = "receive" if client.receive else "store"
            trusted = {"trusted": ",".join(map(str, client.trusted))} if client.trusted else {}
            self.log("client", client=client.identity, key=fingerprint(client.key), **{kind: client.place}, **trusted)
        with listen(config.listen.host, config.listen.port) as server:
            listener = Listener(
                server,
                self._open,
                Opening.close,
                timeout=config.handshake_timeout,
                log=lambda text: self.log("refused", reason=text),
                max_pending=max(config.max_transfers, 16),
            )
            listener.serve()
            self.log("listening", address=f"{config.listen.host}:{server.getsockname()[1]}", tls=config.tls)
            sweep = self.clock()
            try:
                while not stop.is_set():
                    if config.journal_max_age is not None and (now := self.clock()) >= sweep:
                        sweep = now + SWEEP_SECONDS  # (from the clock read before the sweep: no sweep is lost)
                        self.expire(config.journal_max_age)
                    opening = listener.next(0.25)
                    if opening is not None:
                        self._start(opening)
            finally:
                listener.close()
                server.close()  # a new sender is refused at once, not left in the backlog to be cut later
                self._drain()
        self.log("stopped")

    def _open(self, sock: Any, deadline: float) -> Opening:
        config = self.config

        def handshake(sock: socket.socket, seconds: float) -> Channel:
            if any(c.trusted for c in config.clients.values()) and not _speaks_tls(sock, seconds):
                return _unencrypted(sock, config)
            return accept_channel(sock, config.tls, config.key_of, handshake_timeout=seconds)

        return open_connection(
            sock, handshake, deadline, timeout=config.handshake_timeout, idle_timeout=config.idle_timeout
        )

    def _start(self, opening: Opening) -> None:
        client = self.config.clients.get(opening.channel.identity or "")
        if client is None:  # the key lookup knows only configured clients: never here
            opening.close()
            return
        if opening.listing:
            self._run(self._list, opening, client)
            return
        with self._lock:
            total = sum(len(s) for s in self._active.values())
            busy = (
                f"{client.identity} already has {_count(self.config.max_per_client, 'transfer')} running"
                if len(self._active[client.identity]) >= self.config.max_per_client
                else f"{_count(total, 'transfer')} running, the most this service takes"
                if total >= self.config.max_transfers
                else None
            )
        if busy:
            self.metrics.refused(client.identity, "busy")
            self.log("refused", client=client.identity, peer=opening.peer, reason=busy)
            tell(opening.channel, e.EXIT_IO, f"busy: {busy}; try again later")
            opening.close()
            return
        self._run(self._transfer, opening, client)

    def _run(self, work: Callable[[Opening, Client], None], opening: Opening, client: Client) -> None:
        def run() -> None:
            try:
                work(opening, client)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        with self._lock:
            self._threads.add(started(run))

    def _list(self, opening: Opening, client: Client) -> None:
        """Answer a client's :class:`~sendstream.net.session.protocol.ListRequest`: its snapshots, its own only."""
        try:
            snapshots = held(client, self._s3)
            answer = b"".join(listed_line(s) for s in snapshots)
            opening.channel.send_all(answer + status_line(0, f"{len(snapshots)} snapshots"))
            self.log("listed", client=client.identity, peer=opening.peer, snapshots=len(snapshots))
        except Exception as exc:
            self.log("failed", client=client.identity, peer=opening.peer, reason=f"listing: {exc}")
            tell(opening.channel, *failure_status(exc))
        finally:
            opening.close()

    def _transfer(self, opening: Opening, client: Client) -> None:
        began = time.monotonic()
        fields: dict[str, Any] = {"client": client.identity, "peer": opening.peer}
        session: SessionReceiver | None = None
        self.metrics.began(client.identity)
        result, size = "failed", 0
        names: tuple[str, ...] = ()
        claims: list[str] = []
        already = False  # a stored stream sent again
        journal, charge = None, None
        try:
            checkpoint = None
            if opening.identity is not None and not client.archive:  # (a bucket keeps no journal)
                journal = os.path.join(client.place, incoming_name(opening.identity))
                self._hold([f"path {journal}"], claims, client)
                stream = stream_name(opening.identity)
                checkpoint = kept(
                    journal,
                    client.key,
                    opening.identity,
                    lambda why: self.log("discarded", **fields, journal=stream, reason=why),
                )
            if (quota := self._quotas.get(client.identity)) is not None:
                part = os.path.basename(journal) + PART_SUFFIX if journal else None
                charge = quota.begin(part, checkpoint.offset if checkpoint else 0)
            session = SessionReceiver(
                opening,
                reconnect_timeout=0.0,
                start=checkpoint.offset if checkpoint else 0,
                identity=checkpoint.stream if checkpoint else None,
                ledger=(checkpoint.commands, checkpoint.ledger) if checkpoint else None,
            )
            with self._lock:
                self._active[client.identity].add(session)
            resumed = {"resumed": checkpoint.offset} if checkpoint else {}
            self.log("transfer", **fields, compressed=opening.channel.compressed, **resumed)
            if client.archive:
                name, size, names = self._archive(session, client, opening.peer)
            elif client.receive:
                child = {"say": lambda line: self.log("btrfs-receive", **fields, line=line)}
                name, size, names = receive_into(
                    session, client, lambda *what: self._claim(client, claims, *what), checkpoint, charge, **child
                )
            else:
                name, size, names, already = store(session, client, opening.peer, checkpoint, charge)
            session.answer(0, f"already stored: {name} holds these same bytes" if already else "ok")
            result = "ok"
            done = {"subvolumes": name} if client.receive else {"stream": name}
            self.log(
                "received" if client.receive else "stored",
                **fields,
                **done,
                **({"already": True} if already else {}),
                bytes=size,
                seconds=round(time.monotonic() - began, 3),
            )
        except Exception as exc:
            if charge is not None and charge.exceeded and journal is not None:
                remove(journal)  # the same stream again would pass the quota again
            code, message = failure_status(exc)
            if session is not None:
                with contextlib.suppress(Exception):
                    session.answer(code, message)
            else:
                tell(opening.channel, code, message)
                opening.close()
            self.log("failed", **fields, seconds=round(time.monotonic() - began, 3), code=code, reason=message)
        finally:
            self.metrics.ended(client.identity, result, size, names)
            if charge is not None:
                charge.end()
            self._release(claims)
            if session is not None:
                session.close()
                with self._lock:
                    self._active[client.identity].discard(session)

    def _archive(self, session: SessionReceiver, client: Client, peer: str) -> tuple[str, int, tuple[str, ...]]:
        """Check the stream of ``session`` and archive it in ``client``'s bucket (as ``send --to s3://``)."""
        with self._lock:
            if self._s3 is None:
                self._s3 = connect()  # one client for every transfer: it is safe across threads
        location = Location.parse(client.place)
        done = upload(
            session,  # type: ignore[arg-type]
            location, self._s3, wrote=session.wrote, client=client.identity, peer=peer,
        )  # fmt: skip
        session.commit()
        return done.url.rsplit("/", 1)[1], done.size, (done.snapshot,) if done.snapshot else ()

    def _claim(self, client: Client, claims: list[str], subvolume: uuid.UUID, name: str) -> None:
        """Hold ``subvolume`` (everywhere) and ``name`` (in the client's place) for one transfer of ``client``."""
        if os.path.lexists(os.path.join(client.place, name)):
            raise e.SessionError(f"refused: '{e.escaped(name)}' is already in {client.identity}'s place")
        self._hold([f"uuid {subvolume}", f"path {os.path.join(client.place, name)}"], claims, client)

    def _hold(self, wanted: list[str], claims: list[str], client: Client) -> None:
        """Hold what a transfer makes (kept in ``claims``) so that no other running transfer makes it too."""
        with self._lock:
            for claim in wanted:
                if claim in self._claims:
                    raise e.SessionError(f"refused: another transfer is receiving {claim.split(' ', 1)[1]} now")
            for claim in wanted:
                self._claims[claim] = client.identity
                claims.append(claim)

    def _release(self, claims: list[str]) -> None:
        with self._lock:
            for claim in claims:
                del self._claims[claim]

    def expire(self, max_age: float) -> None:
        """Remove the journals not written for ``max_age`` seconds (by :attr:`clock`) that no transfer holds."""
        now = self.clock()
        for client in self.config.clients.values():
            try:
                old = expired(client, max_age, now)
            except OSError as exc:
                self.log("failed", client=client.identity, reason=f"searching {client.place} for journals: {exc}")
                continue
            for journal in old:
                claims: list[str] = []
                try:
                    self._hold([f"path {journal.path}"], claims, client)
                except e.SessionError:
                    continue  # its sender came back meanwhile
                try:
                    remove(journal.path)
                finally:
                    self._release(claims)
                days = round((now - journal.written) / 86400, 1)
                self.log("expired", client=client.identity, journal=journal.name, bytes=journal.size, days=days)

    def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_SECONDS
        while True:
            with self._lock:
                threads = list(self._threads)
                sessions = [s for group in self._active.values() for s in group]
            if not threads:
                return
            if time.monotonic() > deadline:
                for session in sessions:  # cut: each fails, removes its hidden file and says why
                    session.channel.interrupt()
                deadline = float("inf")
            threads[0].join(0.25)


TLS_HANDSHAKE_RECORD = 0x16  # the first byte of every TLS ClientHello


def _speaks_tls(sock: socket.socket, seconds: float) -> bool:
    """Whether the peer's first byte opens a TLS handshake (it is read again by whoever takes the socket)."""
    poller = select.poll()  # not select(): a service's descriptors pass FD_SETSIZE
    poller.register(sock, select.POLLIN)
    if not poller.poll(seconds * 1000):
        raise e.SessionError(f"nothing within {seconds:.3g} s of connecting")
    first = sock.recv(1, socket.MSG_PEEK)
    if not first:
        raise e.SessionError("the connection ended before a TLS handshake or a session hello")
    return first[0] == TLS_HANDSHAKE_RECORD


def _unencrypted(sock: socket.socket, config: Config) -> Channel:
    """A connection without TLS: the client whose ``trusted`` addresses hold the peer's, or refused (and told)."""
    channel = PlainChannel(sock)
    peer = sock.getpeername()
    client = config.trusting(peer[0])
    if client is None:
        why = (
            f"unencrypted from {describe_peer(peer)}, which no client's trusted addresses hold: "
            f"send with --tls {config.tls} and the client's key"
        )
        tell(channel, e.EXIT_TLS, f"refused: {why}")
        channel.close()
        raise e.SessionError(why)
    channel.identity = client.identity
    return channel


def store(
    session: SessionReceiver,
    client: Client,
    peer: str,
    checkpoint: Checkpoint | None = None,
    charge: Charge | None = None,
) -> tuple[str, int, tuple[str, ...], bool]:
    """Check and write the stream of ``session`` into ``client``'s place; once stored, its file name, its
    size, the name of its snapshot, and whether these same bytes were stored under that name already.

    A session's stream is journaled (:class:`~sendstream.net.journal.Journal`: durable checkpoints, a
    resume state signed with the client's key), so that the same stream sent again continues from
    ``checkpoint``, the last one of an earlier run; a raw stream goes to a hidden temporary file. Write
    errors name the stream (a raw one: its place, until its first command names it); on any failure
    nothing is left under the stream's name (:func:`_named`). What is written is counted by ``charge``
    first (against the client's quota).
    """
    progress = Progress("received", mode=NONE)
    ledger = Ledger(checkpoint)
    taken = _Taken(client.place, charge)  # the whole stream, as written (a resumed one: its kept part first)

    with OutputDirectory(os.path.join(client.place, "incoming.stream")) as place:
        if session.raw:
            hidden, fd = place.create_temporary(0o600)
            try:
                with OutputFile(fd, taken.shown) as out:
                    receive_resumable(session, taken.through(_naming(out)), progress, ledger=ledger)
                    out.fsync()
                    taken.shown = out.path
            except BaseException:
                place.unlink(hidden)
                raise
        else:
            assert session.identity is not None
            hidden = incoming_name(session.identity)
            taken.shown = os.path.join(client.place, stream_name(session.identity))
            journal = Journal(os.path.join(client.place, hidden), client.key, checkpoint, shown=taken.shown)
            try:
                if checkpoint is not None:
                    kept_part, buf = journal.prefix(), bytearray(1 << 20)
                    while n := kept_part.readinto(buf):
                        taken.add(memoryview(buf)[:n])
                receive_resumable(session, taken.through(journal.write), progress, journal, ledger)
                journal.finish()
            except BaseException:
                journal.stop(session.written, session.identity, ledger)  # it stays, for the next run
                raise
        try:
            return _named(place, hidden, client, peer, ledger, taken)
        finally:
            place.unlink(hidden)  # named by now, or not to be


class _Taken:
    """The bytes of a stream :func:`store` wrote: counted and hashed as they are written; ``shown`` is
    the stream's path as errors name it (its place, until its name is known)."""

    def __init__(self, shown: str, charge: Charge | None = None) -> None:
        self.digest = hashlib.sha256()
        self.size = 0
        self.shown = shown
        self._charge = charge

    def add(self, data: Any) -> None:
        self.digest.update(data)
        self.size += len(data)

    def through(self, write: Callable[[Any], object]) -> Callable[[Any], None]:
        """``write`` (what it will write charged first), then :meth:`add` what it wrote."""

        def written(data: Any) -> None:
            if self._charge is not None:
                self._charge(len(data))
            write(data)
            self.add(data)

        return written


def _naming(out: OutputFile) -> Callable[[Any], None]:
    """``out.write`` for a raw stream; ``out.path`` (a directory) becomes the stream's name in it as soon
    as the stream's first command, which says it, is in."""
    place, head = out.path, bytearray()

    def write(data: Any) -> None:
        if out.path == place and len(head) < PREFIX_SIZE:
            head.extend(memoryview(data)[: PREFIX_SIZE - len(head)])
            with contextlib.suppress(Unnamed):
                out.path = os.path.join(place, stream_name(stream_identity(bytes(head))))
        out.write(data)

    return write


def _named(
    place: OutputDirectory, hidden: str, client: Client, peer: str, ledger: Ledger, taken: _Taken
) -> tuple[str, int, tuple[str, ...], bool]:
    """Give the whole stream in ``hidden`` (``taken`` as it was written) its name, with its manifest beside
    it (durable before the sender hears success); its name, size, snapshot, and whether these same bytes
    were stored under that name already. A file that is not all the bytes taken is never named, and
    neither is a stream whose name holds other bytes: it is refused, as ``send --to s3://`` refuses."""
    fd = place.open_ours(hidden, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size != taken.size:
            raise e.OutputError(taken.shown, f"it holds {size} bytes of the {taken.size} received: not stored")
        prefix = os.pread(fd, PREFIX_SIZE, 0)  # the prefix says what it is
        identity = stream_identity(prefix)
        name = stream_name(identity)
        shown = os.path.join(client.place, name)
        sha256 = taken.digest.hexdigest()
        record = manifest(
            identity, size=size, sha256=sha256, commands=ledger.commands, ledger=ledger.digest(),
            client=client.identity, peer=peer,
        )  # fmt: skip
        with place.locked():  # another transfer of this name waits until ours is named (or refused)
            already = place.lstat(name) is not None
            if already:
                _refuse_other(place, name, size, sha256, shown)
            if not already or place.lstat(name + ".json") is None:  # (none: cut between the two renames)
                note = _note(place, record, shown + ".json")
                try:
                    if not already:
                        place.replace(hidden, name, fd)
                    place.replace(note, name + ".json")
                except BaseException:
                    place.unlink(note)
                    if not already:
                        place.unlink(name)
                    raise
                place.sync()
    finally:
        os.close(fd)
    snapshot = snapshot_name(prefix)
    return name, size, (snapshot,) if snapshot else (), already


def _refuse_other(place: OutputDirectory, name: str, size: int, sha256: str, shown: str) -> None:
    """Refuse unless the stream stored as ``name`` is ``size`` bytes with the digest ``sha256``."""
    with os.fdopen(place.open_ours(name, os.O_RDONLY), "rb") as f:
        same = os.fstat(f.fileno()).st_size == size and hashlib.file_digest(f, "sha256").hexdigest() == sha256
    if not same:
        raise e.UsageError(f"{shown}: a stream of this name is stored already, with other bytes: not replaced")


def _note(place: OutputDirectory, record: bytes, shown: str) -> str:
    """A new hidden file in ``place`` that holds ``record``, durable (its errors name ``shown``): its name."""
    note, fd = place.create_temporary(0o600)
    try:
        with OutputFile(fd, shown) as f:
            f.write(record)
            f.fsync()
    except BaseException:
        place.unlink(note)
        raise
    return note


def receive_into(
    session: SessionReceiver,
    client: Client,
    claim: Callable[[uuid.UUID, str], object],
    checkpoint: Checkpoint | None = None,
    charge: Charge | None = None,
    say: Callable[[str], object] = lambda line: None,
) -> tuple[str, int, tuple[str, ...]]:
    """Check the stream of ``session`` and give it to ``btrfs receive`` in ``client``'s place, its paths and
    UUIDs confined (:class:`~sendstream.service.confine.UuidGuard`); the subvolumes made, and the size. What
    ``btrfs receive`` writes on stderr goes to ``say``, line by line.

    A session's stream is journaled as :func:`store` journals it, so that the same stream sent again
    continues from ``checkpoint``: ``btrfs receive`` cannot continue what an earlier run began, so the
    subvolumes that run left are deleted and the kept part is given to a new ``btrfs receive`` again
    before the session's bytes. On any failure the subvolumes this run began are deleted; the journal stays.
    What is written is counted by ``charge`` first (against the client's quota).
    """
    made: list[str] = []
    journal, again, ledger = None, False, None
    if not session.raw:
        assert session.identity is not None
        path = os.path.join(client.place, incoming_name(session.identity))
        again = os.path.lexists(path + PART_SUFFIX)  # an earlier run of this stream was cut
        journal, ledger = Journal(path, client.key, checkpoint), Ledger(checkpoint)

    def claimed(subvolume: uuid.UUID, name: str) -> None:
        path = os.path.join(client.place, name)
        # what an earlier run began from the kept part (or, cut before its first checkpoint, its first)
        earlier = journal is not None and (guard.offset < journal.offset or (again and not made))
        if earlier and leftover(path, subvolume):
            _delete_subvolume(path)
        claim(subvolume, name)
        made.append(name)

    guard = UuidGuard(client.place, claimed)
    command = shlex.join(["btrfs", "receive", "--chroot", client.place])
    try:
        with ChildSink(command, stderr=say) as child, guard:

            def replay(data: Any) -> None:
                guard(data)
                child.write(data)

            def write(data: Any) -> None:
                if charge is not None:
                    charge(len(data))
                replay(data)
                if journal is not None:
                    journal.write(data)

            session.flush = child.flush
            progress = Progress("received", mode=NONE)
            summary = receive_resumable(session, write, progress, journal, ledger, replay=replay)
    except BaseException:
        if journal is not None and ledger is not None:
            journal.stop(session.written, session.identity, ledger)
        for name in made:
            _delete_subvolume(os.path.join(client.place, name))
        raise
    if journal is not None:
        journal.discard()
    return ", ".join(made), summary.bytes, tuple(made)


def _delete_subvolume(path: str) -> None:
    """Delete the subvolume at ``path`` that a failed transfer began (nothing when there is none)."""
    with contextlib.suppress(OSError):
        if os.lstat(path).st_ino == 256:
            subprocess.run(["btrfs", "-q", "subvolume", "delete", path], capture_output=True, check=False)
