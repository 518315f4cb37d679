"""``sendstream serve``: one process takes streams from many clients at once, each into its own place.

Connections are opened concurrently (:class:`~sendstream.transport.listener.Listener`):
a wrong key, garbage or silence ends that connection with a logged reason.
Each opened connection runs in a thread of its own: the client is the PSK
identity the handshake proved, its place the one the configuration gives it.
Every command is checked (and a restarted stream healed) before it is
written; the stream goes to a hidden file in the client's place, and only a
whole, checked stream is renamed to its name (:mod:`sendstream.transfer.stored`),
with its manifest beside it. A failure of one transfer is answered to its
sender and logged; the service goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import errors as e
from ..archive.store import BucketClient, connect
from ..io.threads import started
from ..session.connection import busy_answer, failure_status, tell
from ..session.protocol import Listed, Status
from ..session.receiver import Opening, SessionReceiver, open_connection
from ..stores.store import Sender, Store
from ..transfer.journal import PART_SUFFIX
from ..transfer.stored import stream_name
from ..transport.address import listen
from ..transport.compression import Decompressing
from ..transport.listener import MAX_PENDING, MAX_PER_SOURCE, Listener, describe_peer
from ..transport.proxy import read_header
from ..transport.tls import Channel, accept_channel
from ..transport.tls.keys import fingerprint
from .claims import Claims
from .config import Client, Config, load
from .journals import Quota, kept, remove, remove_temporaries, sweep_journals
from .log import EventLog
from .metrics import Metrics, NoMetrics
from .openings import speaks_tls, unencrypted, why_revoked

DRAIN_SECONDS = 30.0  # after SIGTERM, how long running transfers may take to end before they are cut
SWEEP_SECONDS = 3600.0  # how often the places are searched for expired journals (and once at start)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


@dataclasses.dataclass(eq=False)
class _Slot:
    """A transfer or a listing of ``client`` (as its connection proved it), holding one place in the limits."""

    opening: Opening
    client: Client
    cut: str = ""  # why the service cut it: the reload that revoked it


class Service:
    """The service of ``config``: :meth:`run` until ``stop`` is set; :meth:`reload` takes a new configuration."""

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
        self._active: dict[str, set[_Slot]] = {}  # by client: what runs, each registered as it is admitted
        self._threads: dict[threading.Thread, _Slot] = {}  # every transfer's thread, until it ends
        self._s3: BucketClient | None = None
        self._claims = Claims()  # what running transfers make: subvolume UUIDs, subvolumes, journals
        self._pruning: set[str] = set()  # clients whose place is being kept by their policy: their transfers wait
        self._pruned = threading.Condition(self._lock)
        self._listener: Listener[tuple[Opening, Client]] | None = None

    def run(self, stop: threading.Event, hangup: threading.Event | None = None) -> None:
        """Accept and serve until ``stop``; then let running transfers end (at most :data:`DRAIN_SECONDS`).
        Each time ``hangup`` is set, read the configuration's file again (:meth:`reload`)."""
        config = self.config
        for client in config.clients.values():
            self._log_client(client)
            if removed := remove_temporaries(client):  # a service killed mid-transfer left them
                self.log("removed", client=client.identity, temporaries=removed)
        with listen(config.listen.host, config.listen.port) as server:
            self._listener = listener = Listener(
                server,
                self._open,
                lambda item: item[0].close(),
                timeout=config.handshake_timeout,
                log=lambda text: self.log("refused", reason=text),
                max_pending=max(config.max_transfers, MAX_PENDING),
                max_per_source=MAX_PER_SOURCE,
                busy=busy_answer,
            )
            listener.serve()
            self.log("listening", address=f"{config.listen.host}:{server.getsockname()[1]}", tls=config.tls)
            sweep = self.clock()
            try:
                while not stop.is_set():
                    if (age := self.config.journal_max_age) is not None and (now := self.clock()) >= sweep:
                        sweep = now + SWEEP_SECONDS  # (from the clock read before the sweep: no sweep is lost)
                        sweep_journals(self.config.clients.values(), age, now, self._claims, self.log)
                    if hangup is not None and hangup.is_set():
                        hangup.clear()
                        self._reload_file()
                    opened = listener.next(0.25)
                    if opened is not None:
                        self._start(*opened)
            finally:
                listener.close()
                server.close()  # a new sender is refused at once, not left in the backlog to be cut later
                self._drain()
        self.log("stopped")

    def _log_client(self, client: Client) -> None:
        kind = "receive" if client.receive else "store"
        trusted = {"trusted": ",".join(map(str, client.trusted))} if client.trusted else {}
        kept = {"preserve": str(client.preserve)} if client.preserve else {}
        self.log(
            "client", client=client.identity, key=fingerprint(client.key), **{kind: client.place}, **trusted, **kept
        )

    def _reload_file(self) -> None:
        """:meth:`reload` the configuration's file; one that is wrong is logged, and the running one kept."""
        try:
            self.reload(load(self.config.path, warn=lambda text: self.log("warning", message=text)))
        except Exception as exc:
            reason = failure_status(exc)[1]
            self.log("reload-refused", config=self.config.path, reason=reason, kept="the running configuration")

    def reload(self, config: Config) -> None:
        """Serve ``config`` from now on, its clients, keys, places and limits, without cutting what runs;
        but the transfers of a client it no longer has, or whose key it changed, are cut (revoked)."""
        old = self.config
        if config.listen != old.listen:
            raise e.ConfigError(
                config.path,
                f"listen: {config.listen.host}:{config.listen.port}, not {old.listen.host}:{old.listen.port}: "
                "a running service cannot move; restart it to listen elsewhere",
            )
        self.config = config
        self._quotas = {
            name: quota
            if (quota := self._quotas.get(name)) and (quota.limit, quota.client.place) == (c.quota, c.place)
            else Quota(c)
            for name, c in config.clients.items()
            if c.quota is not None
        }  # (a quota that stays keeps counting what its client's running transfers hold)
        if self._listener is not None:
            self._listener.timeout = config.handshake_timeout
        cut = []
        with self._lock:
            for slot in (slot for slots in self._active.values() for slot in slots):
                why = why_revoked(slot.client, slot.opening, config)
                if why and not slot.cut:
                    slot.cut = f"cut: {why}"
                    slot.opening.channel.interrupt()  # it fails, and stops as a transfer that was cut does
                    cut.append(f"{slot.client.identity}@{slot.opening.peer}")
        for client in config.clients.values():
            if old.clients.get(client.identity) != client:
                self._log_client(client)
        changes = {
            "added": sorted(set(config.clients) - set(old.clients)),
            "removed": sorted(set(old.clients) - set(config.clients)),
            "rekeyed": sorted(n for n, c in config.clients.items() if n in old.clients and old.clients[n].key != c.key),
            "cut": cut,
        }
        fields = {name: ",".join(names) for name, names in changes.items() if names}
        self.log("reloaded", config=config.path, clients=len(config.clients), **fields)

    def _open(self, sock: Any, deadline: float) -> tuple[Opening, Client]:
        """Shake hands and read the first words; the opening, and the client as its key or address proved it.

        From a ``proxy_from`` address the PROXY v2 header comes first, and the client it names is the peer
        from then on (its ``trusted`` check, the opening's peer); a LOCAL one (the balancer's health check)
        is closed unlogged (:class:`~sendstream.errors.QuietClose`), a missing or wrong one refused."""
        config = self.config
        client: tuple[str, int] | None = None  # the balancer's client
        local = "a PROXY protocol LOCAL header: the balancer's own connection (its health check)"
        if config.proxy_from:
            try:
                address = sock.getpeername()[0]
            except OSError as exc:  # reset already, its address unknown: HAProxy's check sends LOCAL and resets
                try:
                    quiet = read_header(sock, deadline).source is None  # only to tell a check: nothing is taken
                except (OSError, e.SessionError):
                    quiet = False
                gone = e.QuietClose(local) if quiet else e.SessionError(f"the peer left before it was seen: {exc}")
                raise gone from None
            if config.balancer(address):
                client = read_header(sock, deadline).source
                if client is None:
                    raise e.QuietClose(local)

        def handshake(sock: socket.socket, seconds: float) -> Channel:
            if not speaks_tls(sock, seconds):
                return unencrypted(sock, config, seconds, client)
            return accept_channel(sock, config.tls, config.key_of, handshake_timeout=seconds)

        try:
            opening = open_connection(
                sock,
                handshake,
                deadline,
                timeout=config.handshake_timeout,
                idle_timeout=config.idle_timeout,
                peer=client,
            )
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            if client is None or describe_peer(client) in reason:
                raise
            raise e.SessionError(f"{reason} (from {describe_peer(client)}, through the balancer)") from exc
        return opening, config.clients[opening.channel.identity or ""]

    def _start(self, opening: Opening, client: Client) -> None:
        """Admit a transfer or a listing of ``client`` within the limits (checked and registered at once),
        and run it in a thread; or refuse it, and tell its sender why."""
        config = self.config
        revoked = why_revoked(client, opening, config)
        if revoked:
            self.log("refused", client=client.identity, peer=opening.peer, reason=revoked)
            tell(opening.channel, e.EXIT_TLS, f"refused: {revoked}")
            opening.close()
            return
        slot = _Slot(opening, config.clients[client.identity])  # its settings now (its place may have moved)
        with self._lock:
            mine = self._active.setdefault(client.identity, set())
            total = sum(len(s) for s in self._active.values())
            busy = (
                f"{client.identity} already has {_count(config.max_per_client, 'transfer')} running"
                if len(mine) >= config.max_per_client
                else f"{_count(total, 'transfer')} running, the most this service takes"
                if total >= config.max_transfers
                else None
            )
            if busy is None:
                mine.add(slot)
        if busy:
            self.metrics.refused(client.identity, "busy")
            self.log("refused", client=client.identity, peer=opening.peer, reason=busy)
            tell(opening.channel, e.EXIT_IO, f"busy: {busy}; try again later")
            opening.close()
            return
        self._run(self._list if opening.listing else self._transfer, slot)

    def _run(self, work: Callable[[_Slot], None], slot: _Slot) -> None:
        def run() -> None:
            try:
                work(slot)
            finally:
                self._leave(slot)
                with self._lock:
                    self._threads.pop(threading.current_thread(), None)

        with self._lock:
            self._threads[started(run)] = slot

    def _leave(self, slot: _Slot) -> None:
        """``slot`` no longer counts against the limits (again: nothing)."""
        with self._lock:
            mine = self._active.get(slot.client.identity, set())
            mine.discard(slot)
            if not mine and slot.client.identity not in self.config.clients:
                self._active.pop(slot.client.identity, None)  # a removed client's last

    def _list(self, slot: _Slot) -> None:
        """Answer a client's :class:`~sendstream.session.protocol.ListRequest`: its snapshots, its own only."""
        opening, client = slot.opening, slot.client
        try:
            snapshots = client.store(self._bucket).held()
            machine = opening.inbox.machine
            answer = b"".join(machine.send(Listed(s)) for s in snapshots)
            opening.channel.send_all(answer + machine.send(Status(0, f"{len(snapshots)} snapshots")))
            self.log("listed", client=client.identity, peer=opening.peer, snapshots=len(snapshots))
        except Exception as exc:
            self.log("failed", client=client.identity, peer=opening.peer, reason=slot.cut or f"listing: {exc}")
            tell(opening.channel, *failure_status(exc))
        finally:
            opening.close()

    def _transfer(self, slot: _Slot) -> None:
        opening, client = slot.opening, slot.client
        began = time.monotonic()
        fields: dict[str, Any] = {"client": client.identity, "peer": opening.peer}
        session: SessionReceiver | None = None
        self.metrics.began(client.identity)
        result, size = "failed", 0
        names: tuple[str, ...] = ()
        claims = self._claims.holding(client)
        already = False  # a stored stream sent again
        journal, charge = None, None
        held = contextlib.ExitStack()  # its claim in a bucket that other services share

        def release() -> None:
            """What the transfer held, let go before its sender hears the end (it may send again at once)."""
            if charge is not None:
                charge.end()
            claims.release()
            held.close()
            self._leave(slot)

        try:
            with self._lock:  # no transfer's parent may go from under it
                self._pruned.wait_for(lambda: client.identity not in self._pruning)
            checkpoint = None
            store = client.store(self._bucket)
            if opening.identity is not None:
                stream = stream_name(opening.identity)

                def discarded(why: str) -> None:
                    self.log("discarded", **fields, journal=stream, reason=why)

                def moving() -> int:  # bytes come, or parts complete: the claim is held while it grows
                    return session.received + session.verified if session is not None else 0

                held.enter_context(store.hold(opening.identity, lambda why: self._lost(slot, why), moving))
                if (journal := store.journal(opening.identity)) is not None:
                    claims.path(journal)
                    checkpoint = kept(journal, client.key, opening.identity, discarded)
                else:
                    checkpoint = store.resumed(opening.identity, client.key, discarded)
            if (quota := self._quotas.get(client.identity)) is not None:
                part = os.path.basename(journal) + PART_SUFFIX if journal else None
                charge = quota.begin(part, checkpoint.offset if checkpoint else 0)
            session = SessionReceiver(
                opening,
                reconnect_timeout=0.0,
                start=checkpoint.offset if checkpoint else 0,
                identity=checkpoint.stream if checkpoint else None,
                ledger=(checkpoint.commands, checkpoint.ledger) if checkpoint and checkpoint.ledger else None,
            )
            resumed = {"resumed": checkpoint.offset} if checkpoint else {}
            self.log("transfer", **fields, compressed=isinstance(opening.channel, Decompressing), **resumed)
            sender = Sender(
                client.identity, client.key, opening.peer, checkpoint, charge, claims.subvolume,
                lambda line: self.log("btrfs-receive", **fields, line=line),
            )  # fmt: skip
            taken = store.take(session, sender)
            name, size, names, already = taken.name, taken.size, taken.snapshots, taken.already
            release()
            session.answer(0, f"already stored: {name} holds these same bytes" if already else "ok")
            result = "ok"
            self.log(
                store.taken,
                **fields,
                **{store.named_as: name},
                **({"already": True} if already else {}),
                bytes=size,
                **resumed,
                seconds=round(time.monotonic() - began, 3),
            )
            self._retain(client, store, fields)
        except Exception as exc:
            if charge is not None and charge.exceeded and journal is not None:
                remove(journal)  # the same stream again would pass the quota again
            unledgered = checkpoint is not None and not checkpoint.ledger
            if unledgered and session is not None and checkpoint and session.received == checkpoint.offset:
                with contextlib.suppress(Exception):  # a sender that could not follow it: see Store.unfollowed
                    store.unfollowed()
            code, message = failure_status(exc)
            release()
            if session is not None:
                with contextlib.suppress(Exception):
                    session.answer(code, message)
            else:
                tell(opening.channel, code, message)
                opening.close()
            reason = slot.cut or message
            self.log("failed", **fields, seconds=round(time.monotonic() - began, 3), code=code, reason=reason)
        finally:
            self.metrics.ended(client.identity, result, size, names)
            release()
            if session is not None:
                session.close()

    def _lost(self, slot: _Slot, why: str) -> None:
        """The claim of ``slot``'s stream in the bucket was let go (``why``): cut it."""
        slot.cut = f"cut: its claim in the bucket was let go: {why}"
        slot.opening.channel.interrupt()

    def _retain(self, client: Client, store: Store, fields: dict[str, Any]) -> None:
        """Keep of ``client``'s place what its policy keeps, now, unless another transfer of its runs (its
        parent must not go from under it; the next transfer's end prunes); one admitted meanwhile waits
        until this ends. The stream stored is already told to its sender: a failure here is logged, not
        the transfer's."""
        with self._lock:
            if client.preserve is None or self._active.get(client.identity):
                return
            self._pruning.add(client.identity)  # a transfer admitted from now on waits until this ends
        try:
            retained = store.retain(client.preserve, datetime.datetime.fromtimestamp(self.clock(), datetime.UTC))
        except Exception as exc:
            self.log("failed", **fields, reason=f"keeping by its policy: {exc}")
            return
        finally:
            with self._lock:
                self._pruning.discard(client.identity)
                self._pruned.notify_all()
        if retained.dropped:
            self.log("pruned", **fields, kept=len(retained.kept), deleted=list(retained.dropped))

    def _bucket(self) -> BucketClient:
        """The store's client: one for every transfer into a bucket (it is safe across threads)."""
        with self._lock:
            if self._s3 is None:
                self._s3 = connect()
            return self._s3

    def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_SECONDS
        while True:
            with self._lock:
                threads = list(self._threads)
                slots = list(self._threads.values())  # a transfer that let go of its limits is cut too
            if not threads:
                return
            if time.monotonic() > deadline:
                for slot in slots:  # cut: each fails, removes its hidden file and says why
                    slot.opening.channel.interrupt()
                deadline = float("inf")
            threads[0].join(0.25)
