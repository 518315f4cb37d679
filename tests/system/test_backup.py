"""``sendstream backup`` on loop-device btrfs, as root: nightly runs on a simulated clock to a service with
a file place, a service with a ``btrfs receive`` place, a bucket on SeaweedFS and a local ``btrfs receive``
disk, with changes between runs; after each run every target holds what its policy says and a seeded
sample of kept snapshots restores to a tree equal to its source; at the end every kept one does.

CI runs a week (``SENDSTREAM_BACKUP_DAYS``, default 7); the long tier runs 60 days
(docs/contributing/testing.md)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import fcntl
import json
import os
import random
import re
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO, cast

import pytest
from support.btrfs import need_root_btrfs
from support.loopfs import btrfs_loop
from support.net import CMD, free_port, key_file, wait_listening
from support.s3 import Store, seaweedfs
from support.storing import Log, running
from support.trees import differences

from sendstream import errors as e
from sendstream.archive.state import STATE_SUFFIX
from sendstream.archive.state import load as load_state
from sendstream.archive.store import Location
from sendstream.backup.config import Config
from sendstream.backup.config import load as load_backup
from sendstream.backup.plan import Held
from sendstream.backup.run import local_snapshots, reach, run, status
from sendstream.retention import kept_by_name
from sendstream.service.config import load as load_service
from sendstream.service.log import EventLog
from sendstream.service.server import Service
from sendstream.stores.received import ReceivePlace

pytestmark = pytest.mark.btrfs

START = dt.datetime(2026, 3, 20, 1, 30, tzinfo=dt.UTC)  # across Europe's change to summer time
DAYS = int(os.environ.get("SENDSTREAM_BACKUP_DAYS", "7"))
DOWN = (3, 6)  # the days one target is down (longer than the host keeps its snapshots by policy)


def btrfs(*args: str | Path) -> None:
    subprocess.run(["btrfs", "-q", *map(str, args)], check=True, capture_output=True)


def change(root: Path, day: int, rng: random.Random) -> None:
    """A day's changes: a new file, one rewritten in the middle, modes, owners, times, xattrs, hard links,
    holes, a rename and a deletion (sizes capped: a v1 stream writes a hole's zeros)."""
    (root / f"new-{day}").write_bytes(rng.randbytes(rng.randrange(1, 200_000)))
    files = sorted(p for p in root.iterdir() if p.is_file() and not p.is_symlink())
    victim = rng.choice(files)
    with open(victim, "r+b") as f:
        f.seek(rng.randrange(0, max(1, victim.stat().st_size)))
        f.write(rng.randbytes(rng.randrange(1, 5000)))
    os.chmod(rng.choice(files), rng.choice([0o600, 0o644, 0o755, 0o4711]))
    os.chown(rng.choice(files), rng.randrange(0, 3000), rng.randrange(0, 3000))
    os.setxattr(rng.choice(files), f"user.day{day % 3}".encode(), rng.randbytes(rng.randrange(0, 100)))
    os.utime(rng.choice(files), ns=(rng.randrange(1 << 40) * 1000, rng.randrange(1 << 40) * 1000))
    if not (root / f"link-{day % 4}").exists():
        os.link(rng.choice(files), root / f"link-{day % 4}")
    with open(root / f"sparse-{day % 2}", "ab") as f:
        f.truncate(f.tell() + rng.randrange(1 << 16, 1 << 20))
        f.write(rng.randbytes(4096))
    if day % 3 == 2 and len(files) > 4:
        os.rename(files[1], root / f"renamed-{day}")
        os.unlink(files[2])


def seed(root: Path) -> None:
    btrfs("subvolume", "create", root)
    (root / "dir").mkdir()
    (root / "dir" / "file").write_bytes(b"x" * 10_000)
    (root / "a").write_bytes(os.urandom(50_000))
    (root / "b").write_bytes(b"")
    os.symlink("dir/file", root / "symlink")


def credentials(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's credentials in this process's environment, as a host's would be."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE",
                 "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL"):  # fmt: skip
        monkeypatch.setenv(name, store.env[name])


def held_names(held: list[Held]) -> set[str]:
    return {h.snapshot for h in held if h.snapshot}


def restore_and_compare(
    kind: str, place: str, snapshot: str, source: Path, scratch: Path, env: dict[str, str], *extra: str, by: str = ""
) -> None:
    """``snapshot`` as the target gives it back (``extra``: restore's options; ``by``: the name or UUID asked
    for, its name by default), compared with its source on the host."""
    if kind == "receive":
        assert not differences(source, Path(place) / snapshot), (place, snapshot)
        return
    scratch.mkdir()
    try:
        done = subprocess.run(
            [*CMD, "restore", f"{place}/{by or snapshot}", "--progress", "none", *extra, "--exec",
             f"btrfs receive {shlex.quote(str(scratch))}"],
            capture_output=True, env=env, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, (place, snapshot, done.stderr.decode())
        assert not differences(source, scratch / snapshot), (place, snapshot)
    finally:
        for made in scratch.iterdir():
            btrfs("subvolume", "delete", made)
        scratch.rmdir()


def test_nightly_runs_keep_every_target_as_its_policy_says_and_every_kept_snapshot_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_root_btrfs()
    rng = random.Random(29)
    clock = [START]
    with ExitStack() as stack:
        host = stack.enter_context(btrfs_loop("1G"))
        server = stack.enter_context(btrfs_loop("1G"))
        usb = stack.enter_context(btrfs_loop("1G"))
        (tmp_path / "weed").mkdir()
        store = stack.enter_context(seaweedfs(tmp_path / "weed"))
        credentials(store, monkeypatch)
        bucket = store.bucket()
        for name in ("home", "srv"):
            seed(host / name)
        (host / "snapshots").mkdir()
        for name in ("alpha", "beta", "wrong"):
            key_file(tmp_path / f"{name}.key")
        wrong = (tmp_path / "wrong.key").read_bytes()
        (tmp_path / "places").mkdir()
        (server / "beta").mkdir()
        (tmp_path / "serve.toml").write_text(
            'listen = "127.0.0.1:0"\n'
            '[clients.alpha]\nkey = "alpha.key"\nstore = "places"\npreserve = "3d"\npreserve_min = "no"\n'
            f'[clients.beta]\nkey = "beta.key"\nreceive = "{server}/beta"\npreserve = "2d 1w"\npreserve_min = "no"\n'
        )
        log = Log()
        settings = load_service(str(tmp_path / "serve.toml"))
        service = Service(settings, EventLog(log, "json"), clock=lambda: clock[0].timestamp())
        stack.enter_context(running(service))
        port = int(log.first("listening")["address"].rsplit(":", 1)[1])
        (tmp_path / "backup.toml").write_text(f"""
lock = "backup.lock"
preserve = "2d"
preserve_min = "no"
preserve_hour_of_day = 1

[subvolumes.home]
path = "{host}/home"
snapshots = "{host}/snapshots"

[subvolumes.srv]
path = "{host}/srv"
snapshots = "{host}/snapshots"
targets = ["files", "received", "bucket"]

[targets.files]
service = "127.0.0.1:{port}"
key = "alpha.key"
identity = "alpha"
warn_after = "1d"

[targets.received]
service = "127.0.0.1:{port}"
key = "beta.key"
identity = "beta"

[targets.bucket]
bucket = "s3://{bucket}/host"
endpoint_url = "{store.endpoint}"
key = "alpha.key"
full_every = 3
preserve = "4d"
preserve_min = "no"

[targets.usb]
receive = "{usb}"
preserve = "1d 1w"
preserve_min = "no"
preserve_hour_of_day = 1
""")
        config = load_backup(str(tmp_path / "backup.toml"))
        places = {"files": str(tmp_path / "places"), "received": f"{server}/beta", "bucket": f"s3://{bucket}/host",
                  "usb": str(usb)}  # fmt: skip
        kinds = {"files": "file", "received": "receive", "bucket": "bucket", "usb": "receive"}
        policies = {
            "files": settings.clients["alpha"].preserve, "received": settings.clients["beta"].preserve,
            "bucket": config.targets["bucket"].preserve, "usb": config.targets["usb"].preserve,
        }  # fmt: skip
        sent: dict[str, set[str]] = {t: set() for t in places}
        taken: list[str] = []
        uuids: dict[str, str] = {}  # of every snapshot the host has had
        scratch = server / "scratch"
        for day in range(DAYS):
            for hour in (0, 12) if day == 2 else (0,):  # twice on one day: one day's second snapshot
                clock[0] = START + dt.timedelta(days=day, hours=hour)
                for name in ("home", "srv"):
                    change(host / name, day * 2 + hour, rng)
                before = {name: local_snapshots(s) for name, s in config.subvolumes.items()}
                down = DOWN[0] <= day < DOWN[1]  # a wrong key: its handshake fails, the others go on
                targets = {**config.targets, "received": dataclasses.replace(config.targets["received"], key=wrong)}
                today = dataclasses.replace(config, targets=targets) if down else config
                dry = run(today, now=clock[0], dry_run=True)
                report = run(today, now=clock[0])
                assert dry.deleted == report.deleted, (day, dry.deleted, report.deleted)  # the dry run said it
                assert list(report.failed) == (["received"] if down else []), report.failed
                assert all("handshake" in why for why in report.failed.values()), report.failed
                taken += report.taken.values()
                for target, sends in report.sent.items():
                    names = [s.snapshot for s in sends]
                    assert not set(names) & sent[target], f"{target} was sent {names} again"
                    sent[target] |= set(names)
                local = {name: local_snapshots(s) for name, s in config.subvolumes.items()}
                assert len({s.uuid for ls in local.values() for s in ls}) == sum(map(len, local.values()))
                uuids.update({s.name: s.uuid for ls in before.values() for s in ls})
                uuids.update({s.name: s.uuid for ls in local.values() for s in ls})
                for target, sends in report.sent.items():  # each from the one before, unless a full is due
                    by_name = {h.snapshot: h for h in _held(config, target)}
                    for send in sends:
                        if send.snapshot in by_name and kinds[target] != "receive":
                            parent = uuids.get(send.parent) if send.parent else None
                            assert by_name[send.snapshot].parent_uuid == parent, (target, send)
                    fulls = [s for s in sends if s.parent is None]
                    assert len(fulls) <= (2 if day == 0 or target == "bucket" else 0), (day, target, sends)
                for target in places:
                    held = _held(config, target)
                    subvolumes = [n for n, s in config.subvolumes.items() if target in s.targets]
                    for name in subvolumes:  # the newest of each is there: the next parent
                        if down and target == "received":
                            continue
                        assert local[name][-1].uuid in {h.uuid for h in held}, (day, target, name)
                    policy = policies[target]
                    assert policy is not None
                    wanted = kept_by_name(((n, n) for n in sent[target]), clock[0], policy, newest=True)
                    have = held_names(held)
                    assert wanted <= have, (day, target, sorted(wanted - have))
                    if down and target == "received":
                        pass  # a service prunes after a transfer: none came
                    elif kinds[target] == "receive":  # nothing chains: exactly what the policy keeps
                        assert have == wanted, (day, target, sorted(have - wanted))
                    else:  # and only what a kept one builds on besides
                        assert have <= _with_parents(wanted, held), (day, target, sorted(have - wanted))
                    on_host = {s.name: s for ls in local.values() for s in ls}
                    sample = sorted(have & set(on_host))
                    if sample:
                        pick = rng.choice(sample)
                        restore_and_compare(
                            kinds[target], places[target], pick, host / "snapshots" / pick, scratch, store.env
                        )
                for name, ls in local.items():  # the host's: its policy, and what the targets need
                    kept = {s.name for s in ls}
                    assert kept_by_name(((n, n) for n in taken if n.startswith(name + ".")), clock[0],
                                        config.subvolumes[name].preserve, newest=True) <= kept  # fmt: skip
        rows = status(config, now=clock[0] + dt.timedelta(hours=1))
        assert {(r["subvolume"], r["target"]) for r in rows} == {
            ("home", "files"), ("home", "received"), ("home", "bucket"), ("home", "usb"),
            ("srv", "files"), ("srv", "received"), ("srv", "bucket"),
        }  # fmt: skip
        assert not any(r["stale"] or r["next"] for r in rows), rows
        stale = status(config, now=clock[0] + dt.timedelta(days=2))
        assert [r["target"] for r in stale if r["stale"]] == ["files", "files"]  # only it has warn_after
        restored = 0
        for target in places:  # at the end every kept snapshot that is on the host restores
            for pick in sorted(held_names(_held(config, target)) & set(os.listdir(host / "snapshots"))):
                restore_and_compare(kinds[target], places[target], pick, host / "snapshots" / pick, scratch, store.env)
                restored += 1
        sent_counts = ", ".join(f"{t} {len(n)}" for t, n in sent.items())
        print(f"\n{DAYS} days, {len(taken)} snapshots taken; sent: {sent_counts}; {restored} restored at the end")


def _held(config: Config, target: str) -> list[Held]:
    """What ``target`` holds, as a run asks it."""
    return reach(config.targets[target], lambda line: None).held()


def _with_parents(wanted: set[str], held: list[Held]) -> set[str]:
    by_uuid = {h.uuid: h for h in held}
    out = set(wanted)
    for h in held:
        if h.snapshot in wanted:
            at = h
            while at.parent_uuid in by_uuid:
                at = by_uuid[at.parent_uuid]
                out.add(str(at.snapshot))
    return out


class Served:
    """``sendstream serve`` in a process of its own (to be killed), its JSON log read as it comes."""

    def __init__(self, config: Path, port: int) -> None:
        self.config, self.port = config, port
        self.events: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*CMD, "serve", "--config", str(self.config), "--log-format", "json"],
            stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        threading.Thread(target=self._read, args=(self.process,), daemon=True).start()
        wait_listening(self.port)

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            with self._changed:
                self.events.append(json.loads(line))
                self._changed.notify_all()

    def seen(self, event: str, after: int = 0, timeout: float = 120) -> dict[str, Any]:
        """The first ``event`` logged after the first ``after`` events, once it is."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: next((x for x in self.events[after:] if x["event"] == event), None), timeout
            )
        assert found, f"no {event} after event {after}: {self.events}"
        return found

    def kill(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(60)


def until(done: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """Until ``done()`` (a state the test observes: a journal's size, an upload's parts)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"not {what} after {timeout} s"
        time.sleep(0.01)


def checkpointed(place: Path) -> bool:
    """Whether a transfer into ``place`` has a durable checkpoint (its journal's resume state)."""
    return any(place.glob(".*.incoming*.resume"))


def upload_saved(client: Any, bucket: str, key: bytes) -> bool:
    """Whether a resumable upload into ``bucket`` has saved a state with a part in it."""
    listed = client.list_objects_v2(Bucket=bucket, Prefix="host/").get("Contents", [])
    names = [x["Key"][len("host/") : -len(STATE_SUFFIX)] for x in listed if x["Key"].endswith(STATE_SUFFIX)]
    return any((saved := load_state(client, Location(bucket, "host/"), n, key)) and saved.parts for n in names)


def test_a_run_killed_at_each_step_and_run_again_leaves_every_snapshot_everywhere_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL of ``backup run`` (its service transfer half journaled), of the service (the same), of the
    store (an upload with parts in it), each on that observed event; each time the next run completes:
    every snapshot taken is on every target, none was taken twice, no stream is stored twice, and the
    service and the bucket resume where the cut one stopped (nothing of the kept part sent again)."""
    need_root_btrfs()
    port = free_port()
    rng = random.Random(2929)
    with ExitStack() as stack:
        host = stack.enter_context(btrfs_loop("1G"))
        usb = stack.enter_context(btrfs_loop("1G"))
        (tmp_path / "weed").mkdir()
        store = stack.enter_context(seaweedfs(tmp_path / "weed"))
        credentials(store, monkeypatch)
        bucket, client = store.bucket(), store.client()
        seed(host / "home")
        key_file(tmp_path / "web1.key")
        key_file(tmp_path / "sealing.key")
        place = tmp_path / "place"
        place.mkdir()
        (tmp_path / "serve.toml").write_text(
            f'listen = "127.0.0.1:{port}"\n[clients.web1]\nkey = "web1.key"\nstore = "{place}"\n'
        )
        service = Served(tmp_path / "serve.toml", port)
        stack.callback(service.stop)
        service.start()
        (tmp_path / "backup.toml").write_text(f"""
lock = "backup.lock"
[subvolumes.home]
path = "{host}/home"
[targets.files]
service = "127.0.0.1:{port}"
key = "web1.key"
identity = "web1"
retries = 1
rate_limit = "64M"
[targets.bucket]
bucket = "s3://{bucket}/host"
key = "web1.key"
encrypt_key = "sealing.key"
retries = 1
[targets.usb]
receive = "{usb}"
""")
        argv = [*CMD, "backup", "run", "--config", str(tmp_path / "backup.toml")]

        def started(mib: int = 40) -> subprocess.Popen[str]:
            (host / "home" / "big").write_bytes(rng.randbytes(mib << 20))  # an incremental of that size
            return subprocess.Popen(argv, env=store.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)  # fmt: skip

        def again(code: int = 0) -> str:
            done = subprocess.run(argv, env=store.env, text=True, capture_output=True, timeout=600)
            assert done.returncode == code, done.stderr
            return done.stdout

        # the run itself, killed while the service journals its stream
        mark = len(service.events)
        running = started()
        service.seen("transfer", mark)
        until(lambda: checkpointed(place), "a checkpoint journaled")
        os.killpg(running.pid, signal.SIGKILL)
        running.wait()
        mark = len(service.events)
        said = again()
        assert re.search(r"home -> files: sent \S+ whole \([\d,]+ bytes; resumed at offset [\d,]+\)", said), said
        assert service.seen("transfer", mark).get("resumed", 0) > 0

        # the service, killed while it journals
        mark = len(service.events)
        running = started()
        service.seen("transfer", mark)
        until(lambda: checkpointed(place), "a checkpoint journaled")
        service.kill()
        out, err = running.communicate(timeout=600)
        assert running.returncode == 10 and "1 failed: files:" in err, (out, err)
        assert "home -> bucket: sent" in out and "home -> usb: sent" in out, out
        service.start()
        mark = len(service.events)
        said = again()
        resumed = re.search(r"home -> files: sent (\S+) from \S+ \([\d,]+ bytes; resumed at offset [\d,]+\)", said)
        assert resumed, (said, service.events[mark:])
        assert f"bucket: sent {resumed[1]} " not in said and f"usb: sent {resumed[1]} " not in said, said
        assert service.seen("transfer", mark).get("resumed", 0) > 0

        # the store, killed with parts of an upload in it
        running = started(160)  # parts of 8 MiB, their state saved as they complete
        key = (tmp_path / "web1.key").read_bytes()
        until(lambda: upload_saved(client, bucket, key), "an upload's state saved with a part")
        store.stop(signal.SIGKILL)
        out, err = running.communicate(timeout=600)
        assert running.returncode == 10 and "1 failed: bucket:" in err, (out, err)
        store.start()
        said = again()
        assert re.search(r"home -> bucket: sent \S+ from \S+ \([\d,]+ bytes; resumed at offset [\d,]+\)", said), said

        config = load_backup(str(tmp_path / "backup.toml"))
        local = local_snapshots(config.subvolumes["home"])
        assert len(local) == 6, [s.name for s in local]  # one a run: none taken twice
        for target in config.targets:
            held = _held(config, target)
            uuids = [h.uuid for h in held]
            assert sorted(uuids) == sorted(s.uuid for s in local), target  # every one, each once
        assert len(list(place.glob("*.stream"))) == 6 and not list(place.glob(".*"))
        newest = local[-1].name
        sealed = ("--encrypt-key", str(tmp_path / "sealing.key"))  # the bucket's parts are sealed, names too
        for kind, where, extra, by in (
            ("file", str(place), (), ""), ("bucket", f"s3://{bucket}/host", sealed, local[-1].uuid),
            ("receive", str(usb), (), ""),
        ):  # fmt: skip
            restore_and_compare(kind, where, newest, host / newest, usb / "scratch", store.env, *extra, by=by)


def test_a_target_down_full_or_refusing_fails_alone_and_status_shows_it(tmp_path: Path) -> None:
    """Four targets: a service that takes the stream, one whose client's quota is full, one that refuses
    the key, one where nothing listens. The run backs up to the first and names the three others (exit 10);
    the host keeps every snapshot they lack whatever its policy; status says each (exit 11)."""
    need_root_btrfs()
    port, closed = free_port(), free_port()
    with ExitStack() as stack:
        host = stack.enter_context(btrfs_loop("512M"))
        seed(host / "home")
        for name in ("web1", "tiny", "wrong"):
            key_file(tmp_path / f"{name}.key")
        for name in ("web1", "tiny"):
            (tmp_path / name).mkdir()
        (tmp_path / "serve.toml").write_text(
            f'listen = "127.0.0.1:{port}"\n[clients.web1]\nkey = "web1.key"\nstore = "web1"\n'
            '[clients.tiny]\nkey = "tiny.key"\nstore = "tiny"\nquota = "4K"\n'
        )
        service = Served(tmp_path / "serve.toml", port)
        stack.callback(service.stop)
        service.start()
        target = 'service = "127.0.0.1:{}"\nkey = "{}.key"\nidentity = "{}"\nretries = 0\n'
        (tmp_path / "backup.toml").write_text(
            f'lock = "backup.lock"\npreserve = "1h"\npreserve_min = "no"\n[subvolumes.home]\npath = "{host}/home"\n'
            f"[targets.good]\n{target.format(port, 'web1', 'web1')}"
            f"[targets.full]\n{target.format(port, 'tiny', 'tiny')}"
            f"[targets.refusing]\n{target.format(port, 'wrong', 'web1')}"
            f"[targets.down]\n{target.format(closed, 'web1', 'web1')}"
        )
        config = ["--config", str(tmp_path / "backup.toml")]
        for round in range(2):
            (host / "home" / f"round-{round}").write_text(f"{round}\n")
            done = subprocess.run([*CMD, "backup", "run", *config], capture_output=True, text=True, timeout=300)
            assert done.returncode == 10, done.stderr
            assert "home -> good: sent" in done.stdout, done.stdout
            (said,) = [line for line in done.stderr.splitlines() if "failed" in line]
            assert "3 failed: full: " in said, said
            assert "; refusing: " in said and "; down: " in said, said
            assert "quota" in said.split("; refusing:")[0], said  # what each one's failure was
        local = local_snapshots(load_backup(str(tmp_path / "backup.toml")).subvolumes["home"])
        assert len(local) == 2  # the policy keeps one; the failing targets lack both
        status = subprocess.run([*CMD, "backup", "status", *config, "--json"], capture_output=True, text=True)
        assert status.returncode == 11, status.stderr
        rows = {row["target"]: row for row in map(json.loads, status.stdout.splitlines())}
        assert not rows["good"]["stale"] and rows["good"]["last"] == local[-1].name and rows["good"]["chain"] == 1
        assert rows["full"]["stale"] and rows["full"]["last"] is None
        assert [s["snapshot"] for s in rows["full"]["next"]] == [s.name for s in local]
        assert rows["refusing"]["stale"] and "handshake" in rows["refusing"]["error"]
        assert rows["down"]["stale"] and "refused" in rows["down"]["error"]
        assert "behind: home -> full, home -> refusing, home -> down" in status.stderr, status.stderr


def test_a_second_run_while_one_runs_stops_at_once_naming_the_lock(tmp_path: Path) -> None:
    """Two runs never overlap: while the lock is held (as a run holds it: flock, its process ID in it), a
    run stops before it takes a snapshot (exit 4) and says who holds it; once it is free, nothing stale
    in the file stops a run."""
    (tmp_path / "home").mkdir()
    key_file(tmp_path / "web1.key")
    lock = tmp_path / "backup.lock"
    (tmp_path / "backup.toml").write_text(
        'lock = "backup.lock"\n[subvolumes.home]\npath = "home"\n[targets.nas]\nservice = "127.0.0.1:1"\n'
        'key = "web1.key"\nidentity = "web1"\nretries = 0\n'
    )
    argv = [*CMD, "backup", "run", "--config", str(tmp_path / "backup.toml")]
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"4242\n")
        held = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        os.close(fd)
    assert held.returncode == 4, held.stderr
    assert held.stderr == f"sendstream: error: another backup run holds {lock} (process 4242): this one stops\n"
    assert held.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == [
        "backup.lock", "backup.toml", "home", "web1.key"
    ]  # fmt: skip
    free = subprocess.run(argv, capture_output=True, text=True, timeout=60)  # then: what is wrong next
    assert free.returncode == 2, free.stderr
    assert free.stderr.endswith(f"subvolumes.home.path '{tmp_path / 'home'}' is not a btrfs subvolume\n"), free.stderr


def test_a_receive_target_leaves_what_is_not_its_stream_s(tmp_path: Path) -> None:
    """A subvolume already in a ``btrfs receive`` target under the name a stream makes, not received from
    it: the stream is refused, naming it, and the subvolume stays (a failed receive deletes only what it
    made)."""
    need_root_btrfs()
    with ExitStack() as stack:
        host = stack.enter_context(btrfs_loop("512M"))
        disk = stack.enter_context(btrfs_loop("512M"))
        seed(host / "home")
        btrfs("subvolume", "snapshot", "-r", host / "home", host / "home.20261204T0130")
        btrfs("subvolume", "create", disk / "home.20261204T0130")
        (disk / "home.20261204T0130" / "mine").write_text("not a backup\n")
        sender = subprocess.Popen(["btrfs", "send", "-q", str(host / "home.20261204T0130")], stdout=subprocess.PIPE)
        assert sender.stdout is not None
        with pytest.raises(e.OutputError, match=r"'home\.20261204T0130' is there already, and is not this stream's"):
            ReceivePlace(str(disk)).receive(cast(BinaryIO, sender.stdout))
        sender.kill()
        sender.wait()
        assert (disk / "home.20261204T0130" / "mine").read_text() == "not a backup\n"


def test_a_lock_that_another_user_made_is_refused(tmp_path: Path) -> None:
    """The lock is the run's own: one made by another user (who could hold it for ever) is named, not used."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to give the lock to another user (CI is root)")
    (tmp_path / "home").mkdir()
    key_file(tmp_path / "web1.key")
    (tmp_path / "backup.lock").write_text("")
    os.chown(tmp_path / "backup.lock", 12345, 12345)
    (tmp_path / "backup.toml").write_text(
        'lock = "backup.lock"\n[subvolumes.home]\npath = "home"\n[targets.nas]\nservice = "127.0.0.1:1"\n'
        'key = "web1.key"\nidentity = "web1"\n'
    )
    done = subprocess.run(
        [*CMD, "backup", "run", "--config", str(tmp_path / "backup.toml")], capture_output=True, text=True
    )
    assert done.returncode == 4, done.stderr
    assert "the backup's lock belongs to user 12345, not to this one: remove it" in done.stderr, done.stderr
