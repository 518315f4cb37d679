"""``backup run`` and ``backup status``: the thin driver of :mod:`.plan` that owns the host's subvolumes
(``btrfs subvolume snapshot``, ``btrfs send``), the targets and the lock.

One run, under an exclusive lock (a run that finds it held says who holds it and stops): a read-only
snapshot of each subvolume; then for each target what it holds (its list: a service's ``send --list``,
a bucket's manifests, a ``btrfs receive`` directory's received UUIDs), and what :func:`~.plan.sends`
says goes, each ``btrfs send`` checked and healed on its way; a target that fails is named and the others
go on. Then each target that has a policy keeps what it says (a service keeps by its own ``serve.toml``),
and the host's snapshots are kept by theirs, never one a target still needs (:func:`~.plan.pins`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, cast

from .. import errors as e
from ..retention import snapshot_time
from ..stores.confine import placed
from .config import Config, Subvolume, Target
from .plan import Held, Local, Send, Standing, local_kept, pins, sends, snapshot_name, standing

if TYPE_CHECKING:
    from ..stores.store import Store

Say = Callable[[str], object]
_SUBVOLUME_ROOT = 256  # the inode of a btrfs subvolume's root directory


@dataclasses.dataclass(frozen=True)
class Moved:
    """A stream a target took: its size, and the bytes an earlier, cut run had got there (not sent again)."""

    size: int
    resumed: int = 0

    def __str__(self) -> str:
        return f"{self.size:,} bytes" + (f"; resumed at offset {self.resumed:,}" if self.resumed else "")


@dataclasses.dataclass
class Report:
    """What a run did (or, dry, would do)."""

    taken: dict[str, str] = dataclasses.field(default_factory=dict)  # subvolume -> snapshot
    sent: dict[str, list[Send]] = dataclasses.field(default_factory=dict)  # target -> streams
    failed: dict[str, str] = dataclasses.field(default_factory=dict)  # target -> why
    deleted: list[str] = dataclasses.field(default_factory=list)  # of the host's snapshots
    pruned: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # target -> what went


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold the run's lock (``flock`` on ``path``, made if missing); a run that finds it held stops."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise e.OutputError(path, f"cannot open the backup's lock: {exc.strerror}") from None
    try:
        if (owner := os.fstat(fd).st_uid) != os.geteuid():  # (one made by another user could be held by them)
            raise e.OutputError(path, f"the backup's lock belongs to user {owner}, not to this one: remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise e.RunLocked(path, os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def local_snapshots(subvolume: Subvolume) -> list[Local]:
    """The host's read-only snapshots of ``subvolume`` (``NAME.YYYYMMDDTHHMM`` in its snapshot directory),
    oldest first; a usage error when its path is not a btrfs subvolume."""
    try:
        root = os.stat(subvolume.path).st_ino == _SUBVOLUME_ROOT
    except OSError as exc:
        raise e.OutputError(subvolume.path, f"subvolumes.{subvolume.name}.path: {exc.strerror}") from None
    if not root:
        raise e.UsageError(f"subvolumes.{subvolume.name}.path {subvolume.path!r} is not a btrfs subvolume")
    mine, _ = placed(subvolume.snapshots)
    out = []
    for name, found in mine.items():
        said = snapshot_time(name, subvolume.preserve)
        if said is None or said[0] != subvolume.name or not found.readonly or found.uuid is None:
            continue
        received = str(found.received_uuid) if found.received_uuid else None
        out.append(Local(name, str(found.uuid), received, said[1], found.id))
    return sorted(out, key=lambda s: s.id)  # as they were taken (a name's time may repeat, or go back)


def _btrfs(*args: str) -> None:
    done = subprocess.run(["btrfs", *args], capture_output=True, check=False)
    if done.returncode:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise e.ChildFailed(f"btrfs {' '.join(args)} exited with status {done.returncode}: {' '.join(said[-2:])}")


class Reached(Protocol):
    """A target as a run reaches it: what it holds, a stream sent to it, its policy applied."""

    target: Target

    def held(self) -> list[Held]: ...

    def put(self, source: BinaryIO) -> Moved: ...

    def retain(self, now: datetime.datetime, dry_run: bool) -> tuple[str, ...]: ...


class _Service:
    """A ``sendstream serve``: asked with ``send --list``, sent to resumably; it keeps by its own policy."""

    def __init__(self, target: Target, log: Say) -> None:
        from ..endpoints.sending import connector
        from ..transport.address import Address, Dialing, TlsSettings

        self.target, self._log = target, log
        settings = TlsSettings(target.tls, target.key, target.identity)
        dialing = Dialing(Address.parse(target.place), settings, target.timeout, target.rate_limit)
        self._connect = connector(dialing, log)

    def held(self) -> list[Held]:
        from ..endpoints.sending import list_held

        return [Held.of(s) for s in list_held(self._connect)]

    def put(self, source: BinaryIO) -> Moved:
        from ..endpoints.sending import send
        from ..transfer.progress import NONE, Progress

        t = self.target
        done = send(
            source, self._connect, Progress("sent", mode=NONE), resumable=True, retries=t.retries, log=self._log
        )
        return Moved(done.skipped + done.bytes, done.skipped)

    def retain(self, now: datetime.datetime, dry_run: bool) -> tuple[str, ...]:
        return ()


class _Place:
    """A bucket or a ``btrfs receive`` directory, reached through its :class:`~sendstream.stores.store.Store`."""

    def __init__(self, target: Target, log: Say) -> None:
        from ..stores.bucket import Bucket
        from ..stores.received import ReceivePlace

        self.target, self._log = target, log
        self._received = ReceivePlace(target.place) if target.kind == "receive" else None  # takes a raw stream
        self._store: Store = self._received or Bucket(target.place, endpoint_url=target.endpoint_url)

    def held(self) -> list[Held]:
        return [Held.of(s) for s in self._store.held()]

    def put(self, source: BinaryIO) -> Moved:
        t = self.target
        if self._received is not None:
            return Moved(self._received.receive(source, self._log).size, 0)
        retries = t.retries if t.key else 0
        done = self._store.upload(source, key=t.key, encrypt_key=t.encrypt_key, retries=retries, notice=self._log)
        return Moved(done.size, done.resumed)

    def retain(self, now: datetime.datetime, dry_run: bool) -> tuple[str, ...]:
        if self.target.preserve is None:
            return ()
        return self._store.retain(self.target.preserve, now, dry_run=dry_run).dropped


def reach(target: Target, log: Say) -> Reached:
    """``target``, reached as a run reaches it."""
    return _Service(target, log) if target.kind == "service" else _Place(target, log)


def _send(subvolume: Subvolume, send: Send, reached: Reached) -> Moved:
    """``btrfs send`` of ``send`` (from its parent), its stream to ``reached``."""
    path = os.path.join(subvolume.snapshots, send.snapshot)
    args = [
        "btrfs",
        "send",
        "-q",
        *(["-p", os.path.join(subvolume.snapshots, send.parent)] if send.parent else []),
        path,
    ]
    with tempfile.TemporaryFile() as said:
        child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=said)
        assert child.stdout is not None
        try:
            with child.stdout:
                moved = reached.put(cast(BinaryIO, child.stdout))
        except BaseException:
            child.kill()
            child.wait()
            raise
        if code := child.wait():
            said.seek(0)
            raise e.ChildFailed(
                f"{' '.join(args)} exited with status {code}: {said.read(4096).decode(errors='replace').strip()}"
            )
    return moved


def run(
    config: Config,
    *,
    now: datetime.datetime | None = None,
    dry_run: bool = False,
    say: Say = lambda line: None,
    log: Say = lambda line: None,
) -> Report:
    """One backup run at ``now`` (default: the clock's): what it took, sent, deleted, and the targets that
    failed (the others are done all the same)."""
    now = now or datetime.datetime.now(datetime.UTC)
    report = Report()
    with locked(config.lock) if not dry_run else contextlib.nullcontext():
        local: dict[str, list[Local]] = {}
        for name, subvolume in config.subvolumes.items():
            have = local_snapshots(subvolume)
            new = snapshot_name(name, now, (s.name for s in have))
            if dry_run:
                have.append(Local(new, "(to be taken)", None, now))
                say(f"{name}: would take {new}")
            else:
                try:
                    _btrfs("subvolume", "snapshot", "-r", subvolume.path, os.path.join(subvolume.snapshots, new))
                except (e.SendStreamError, OSError) as exc:  # its older snapshots still go where they lack
                    report.failed[f"{name} (its snapshot)"] = str(exc)
                    say(f"{name}: failed to take {new}: {exc}")
                    local[name] = have
                    continue
                have = local_snapshots(subvolume)
                say(f"{name}: took {new}")
            report.taken[name] = new
            local[name] = have
        held_after: dict[str, list[Held] | None] = {}
        for tname, target in config.targets.items():
            reached = reach(target, log)
            try:
                held = reached.held()
                planned: list[Held] = []  # what a dry run would have sent: the target holds it after
                for name, subvolume in config.subvolumes.items():
                    if tname not in subvolume.targets:
                        continue
                    for send in sends(local[name], held, now, subvolume.preserve, target.full_every):
                        kind = f"from {send.parent}" if send.parent else "whole"
                        if dry_run:
                            say(f"{name} -> {tname}: would send {send.snapshot} {kind} ({send.why})")
                            uuid = next(s.uuid for s in local[name] if s.name == send.snapshot)
                            planned.append(Held(uuid, None, send.snapshot, None))
                            continue
                        moved = _send(subvolume, send, reached)
                        report.sent.setdefault(tname, []).append(send)
                        say(f"{name} -> {tname}: sent {send.snapshot} {kind} ({moved})")
                held_after[tname] = (held + planned) if dry_run else reached.held()
                if pruned := reached.retain(now, dry_run):
                    report.pruned[tname] = pruned
                    say(f"{tname}: {'would prune' if dry_run else 'pruned'} {', '.join(pruned)}")
            except (e.SendStreamError, OSError) as exc:
                report.failed[tname] = str(exc)
                held_after.setdefault(tname, None)
                say(f"{tname}: failed: {exc}")
        for name, subvolume in config.subvolumes.items():
            _keep_local(name, subvolume, local[name], held_after, now, dry_run, report, say)
    return report


def _keep_local(
    name: str,
    subvolume: Subvolume,
    have: list[Local],
    held_after: dict[str, list[Held] | None],
    now: datetime.datetime,
    dry_run: bool,
    report: Report,
    say: Say,
) -> None:
    """Keep the host's snapshots of ``subvolume`` by its policy, and every one a target still needs; a
    target whose holdings are not known (it failed before it said) keeps them all."""
    pinned: dict[str, str] = {}
    for tname in subvolume.targets:
        held = held_after.get(tname)
        if held is None:
            pinned.update({s.name: f"{tname} could not say what it holds" for s in have})
        else:
            pinned.update(pins(have, held, tname))
    for decision in local_kept(have, subvolume.preserve, now, pinned):
        if decision.keep:
            continue
        if not dry_run:
            try:
                _btrfs("subvolume", "delete", os.path.join(subvolume.snapshots, decision.key))
            except (e.SendStreamError, OSError) as exc:  # the others go on; the run says it failed
                report.failed[f"{name} (deleting {decision.key})"] = str(exc)
                say(f"{name}: failed to delete {decision.key}: {exc}")
                continue
        report.deleted.append(decision.key)
        say(f"{name}: {'would delete' if dry_run else 'deleted'} {decision.key}")


def status(
    config: Config, *, now: datetime.datetime | None = None, log: Say = lambda line: None
) -> list[dict[str, Any]]:
    """Per subvolume and target: the newest snapshot the target holds, its age, the chain it ends, what the
    next run sends, and problems (``stale``: older than ``warn_after`` or none; ``error``: not reached)."""
    now = now or datetime.datetime.now(datetime.UTC)
    local = {name: local_snapshots(s) for name, s in config.subvolumes.items()}
    rows = []
    for tname, target in config.targets.items():
        try:
            held: list[Held] | None = reach(target, log).held()
            problem = None
        except e.SendStreamError as exc:
            held, problem = None, str(exc)
        for name, subvolume in config.subvolumes.items():
            if tname not in subvolume.targets:
                continue
            row: dict[str, Any] = {"subvolume": name, "target": tname, "kind": target.kind}
            if held is None:
                rows.append({**row, "error": problem, "stale": True})
                continue
            where: Standing = standing(
                local[name], held, now, subvolume.preserve, target.full_every, target.warn_after, name
            )
            rows.append(
                {
                    **row,
                    "last": where.last,
                    "last_time": where.time.isoformat(timespec="seconds") if where.time else None,
                    "age_seconds": int(where.age.total_seconds()) if where.age is not None else None,
                    "chain": where.chain,
                    "next": [{"snapshot": s.snapshot, "parent": s.parent, "why": s.why} for s in where.next],
                    "stale": where.stale,
                    "warn_after_seconds": int(target.warn_after.total_seconds()) if target.warn_after else None,
                }
            )
    return rows
