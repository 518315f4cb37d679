#!/usr/bin/env python3
"""A soak of ``sendstream serve``: many transfers from many clients while hostile connections knock,
senders are killed mid-stream and the service itself is killed and started again.

Usage::

    python3 tools/soak_serve.py [--transfers 200] [--clients 8] [--service-kills 2] [--seed 1] [--json]

What it does, all on loopback, with real processes (``sendstream serve`` and ``sendstream send``):

- ``--clients`` clients, each with its own key and store place, send ``--transfers`` streams in all
  (each client one after another, the clients at once): full and incremental streams of 50 KB to
  6 MB made from the fixtures with fresh UUIDs, plain or ``--resumable``, some ``--compress zstd``,
  some paced by ``--rate-limit`` so that they are in flight when something is killed;
- every few transfers (seeded) a sender is SIGKILLed once it has taken a seeded number of bytes
  (the bytes handed to its standard input: the event, not a sleep), and the transfer is sent
  again; a resumable one goes on from the service's journal;
- the service is SIGKILLed ``--service-kills`` times, each when the log shows a seeded transfer
  beginning (the event), and started again at once; resumable senders reconnect and go on, the
  others fail (and say so) and are sent again;
- all along, connections from other loopback addresses knock: silent ones (held open), garbage,
  slow-loris (a TLS record header, then a byte a second) and senders with a wrong key.

What must hold (the exit status is 1 otherwise, with the failures listed):

- every stream a sender was told is stored is in its client's place, byte for byte, with a manifest
  whose size and SHA-256 are the stream's, and verifies;
- every sender that failed and was not killed by the soak said why (an error line, non-zero exit);
- nothing is left in the places but the streams and their manifests;
- the service's RSS grows less than ``--rss-growth-mb`` (10) from the 50th transfer to the last
  (the service kills come before the 50th: ``--rss-from``).

Figures are printed at the end (``--json``: one JSON object).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(REPO))

from sendstream import Command, Decoder, encode_command  # noqa: E402
from sendstream.ops.verify import verify_file  # noqa: E402
from sendstream.transport.tls.keys import new_key_file  # noqa: E402

CMD = [sys.executable, "-m", "sendstream"]
FULL = REPO / "fixtures" / "rich-full-v2.stream"
INCR = REPO / "fixtures" / "rich-incr-v2.stream"
UUID, CTRANSID, CLONE_UUID, CLONE_CTRANSID = 1, 2, 20, 21


def renamed(template: bytes, subvolume: uuid.UUID, ctransid: int, parent: tuple[uuid.UUID, int] | None) -> bytes:
    """``template`` (a fixture) with its first command (subvol or snapshot) saying another subvolume."""
    decoder = Decoder()
    decoder.receive_data(template)
    decoder.receive_data(b"")
    decoder.next_event()  # the stream header
    first = decoder.next_event()
    assert isinstance(first, Command), first
    values = {UUID: subvolume.bytes, CTRANSID: ctransid.to_bytes(8, "little")}
    if parent is not None:
        values |= {CLONE_UUID: parent[0].bytes, CLONE_CTRANSID: parent[1].to_bytes(8, "little")}
    attributes: list[tuple[int, memoryview | bytes]] = [(t, values.get(t, bytes(v))) for t, v in first.attributes or []]
    start, end = first.offset, first.offset + 10 + int.from_bytes(template[first.offset : first.offset + 4], "little")
    return template[:start] + encode_command(Command(first.cmd, attributes), first.version) + template[end:]


@dataclass
class Transfer:
    index: int
    client: str
    data: bytes
    name: str
    resumable: bool
    compress: bool
    rate: str | None
    cut: int | None  # the sender is killed once it has taken this many bytes
    attempts: list[tuple[int, str]] = field(default_factory=list)  # exit code, last stderr line
    stored: bool = False


def stream_name(subvolume: uuid.UUID, ctransid: int, parent: tuple[uuid.UUID, int] | None) -> str:
    name = f"{subvolume}.{ctransid}"
    if parent is not None:
        name += f".from.{parent[0]}.{parent[1]}"
    return name + ".stream"


def plan(transfers: int, clients: list[str], rng: random.Random) -> list[Transfer]:
    """The transfers, seeded: per client a full stream, then incrementals on it, now and then a new full."""
    full, incr = FULL.read_bytes(), INCR.read_bytes()
    last: dict[str, tuple[uuid.UUID, int]] = {}
    out = []
    for i in range(transfers):
        client = clients[i % len(clients)]
        subvolume = uuid.UUID(int=rng.getrandbits(128), version=4)
        ctransid = 1000 + i
        parent = last.get(client) if rng.random() < 0.6 else None
        data = renamed(incr if parent else full, subvolume, ctransid, parent)
        if rng.random() < 0.3:
            data += full * rng.randrange(2, 22)  # 0.8-6 MB: long enough to be cut
        last[client] = (subvolume, ctransid)
        resumable = rng.random() < 0.5
        out.append(
            Transfer(
                index=i,
                client=client,
                data=data,
                name=stream_name(subvolume, ctransid, parent),
                resumable=resumable,
                compress=rng.random() < 0.3,
                rate="4M" if len(data) > 1 << 20 and rng.random() < 0.5 else None,
                cut=rng.randrange(len(data) // 4, len(data) * 3 // 4) if len(data) > 1 << 20 and i % 5 == 2 else None,
            )
        )
    return out


class Service:
    """``sendstream serve`` as a child, its JSON log read as it comes."""

    def __init__(self, config: Path, port: int) -> None:
        self.config = config
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.events: list[dict[str, object]] = []
        self.cond = threading.Condition()
        self.starts = 0

    def start(self) -> None:
        argv = [*CMD, "serve", "--config", str(self.config), "--log-format", "json"]
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE)  # (serve settles its malloc itself)
        self.starts += 1
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        self.wait_for(lambda ev: ev.get("event") == "listening", since=len(self.events), seconds=30)

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "unparsed", "line": line.decode(errors="replace")}
            with self.cond:
                self.events.append(event)
                self.cond.notify_all()

    def wait_for(self, match: Callable[[dict[str, object]], bool], since: int = 0, seconds: float = 120) -> None:
        """Until an event of the log from the ``since``-th on matches."""
        self.wait_count(match, 1, since, seconds)

    def wait_count(
        self, match: Callable[[dict[str, object]], bool], count: int, since: int = 0, seconds: float = 120
    ) -> None:
        """Until ``count`` events of the log from the ``since``-th on match."""
        deadline = time.monotonic() + seconds
        with self.cond:
            while True:
                if sum(map(match, self.events[since:])) >= count:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no such event in the service's log within {seconds} s")
                self.cond.wait(left)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def rss(self) -> int:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) * 1024  # type: ignore[union-attr]


class Knockers:
    """Hostile connections from other loopback addresses while the soak runs."""

    def __init__(self, port: int, tmp: Path, rng: random.Random) -> None:
        self.port = port
        self.stop = threading.Event()
        self.counts = {"silent": 0, "garbage": 0, "slow-loris": 0, "wrong-key": 0}
        self.tmp = tmp
        self.rng = rng
        self.threads = [
            threading.Thread(target=run, daemon=True) for run in (self._silent, self._garbage, self._slow, self._wrong)
        ]

    def __enter__(self) -> Knockers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _connect(self, source: str) -> socket.socket | None:
        sock = socket.socket()
        try:
            sock.bind((source, 0))
            sock.settimeout(2)
            sock.connect(("127.0.0.1", self.port))
            return sock
        except OSError:
            sock.close()
            return None

    def _silent(self) -> None:
        held: list[socket.socket] = []
        while not self.stop.wait(0.05):
            sock = self._connect("127.0.0.2")
            if sock is not None:
                held.append(sock)
                self.counts["silent"] += 1
            while len(held) > 200:
                held.pop(0).close()
        for sock in held:
            sock.close()

    def _garbage(self) -> None:
        while not self.stop.wait(0.2):
            sock = self._connect("127.0.0.3")
            if sock is None:
                continue
            with sock, contextlib.suppress(OSError):
                sock.sendall(os.urandom(self.rng.randrange(1, 8192)))
                self.counts["garbage"] += 1

    def _slow(self) -> None:
        open_: list[socket.socket] = []
        while not self.stop.wait(1.0):
            sock = self._connect("127.0.0.4")
            if sock is not None:
                open_.append(sock)
                self.counts["slow-loris"] += 1
            for s in list(open_):
                try:
                    s.send(b"\x16")  # a TLS record's first byte, then one a second
                except OSError:
                    open_.remove(s)
                    s.close()
            while len(open_) > 20:
                open_.pop(0).close()
        for s in open_:
            s.close()

    def _wrong(self) -> None:
        wrong = self.tmp / "wrong.key"
        new_key_file(str(wrong))
        while not self.stop.wait(3.0):
            argv = [*CMD, "send", "--to", f"127.0.0.1:{self.port}", str(FULL), "--key", str(wrong),
                    "--identity", "c0", "--progress", "none", "--retries", "0"]  # fmt: skip
            done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
            if done.returncode == 0:
                raise AssertionError("a sender with a wrong key got in")
            self.counts["wrong-key"] += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def send_once(transfer: Transfer, port: int, key: Path) -> tuple[int, str, bool]:
    """One run of ``sendstream send`` fed from a pipe: its exit code, its last stderr line, and whether
    the soak killed it (at ``transfer.cut``, the first time)."""
    argv = [*CMD, "send", "--to", f"127.0.0.1:{port}", "-", "--key", str(key), "--identity", transfer.client,
            "--progress", "none", "--retries", "30", "--retry-delay", "0.5"]  # fmt: skip
    if transfer.resumable:
        argv.append("--resumable")
    if transfer.compress:
        argv += ["--compress", "zstd"]
    if transfer.rate:
        argv += ["--rate-limit", transfer.rate]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    cut = transfer.cut if not transfer.attempts else None
    errors: list[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    killed = False
    assert proc.stdin is not None
    try:
        step = 1 << 16
        for at in range(0, len(transfer.data), step):
            if cut is not None and at >= cut:
                proc.kill()
                killed = True
                break
            proc.stdin.write(transfer.data[at : at + step])
        proc.stdin.close()
    except BrokenPipeError:
        pass
    code = proc.wait(300)
    reader.join(30)
    lines = (errors[0] if errors else b"").decode(errors="replace").strip().splitlines()
    return code, lines[-1] if lines else "", killed


def run(args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="soak-serve-") as tmp_name:
        tmp = Path(tmp_name)
        clients = [f"c{i}" for i in range(args.clients)]
        port = free_port()
        text = f'listen = "127.0.0.1:{port}"\nmax_transfers = 16\nmax_per_client = 2\n'
        text += "handshake_timeout = 5\nidle_timeout = 60\n"
        (tmp / "keys").mkdir()
        for name in clients:
            new_key_file(str(tmp / "keys" / f"{name}.key"))
            (tmp / "places" / name).mkdir(parents=True)
            text += f'[clients.{name}]\nkey = "keys/{name}.key"\nstore = "places/{name}"\n'
        config = tmp / "serve.toml"
        config.write_text(text)
        transfers = plan(args.transfers, clients, rng)
        kills = sorted(rng.sample(range(len(clients), min(args.rss_from, args.transfers)), args.service_kills))
        service = Service(config, port)
        service.start()
        done_count = 0
        rss: dict[str, int] = {}
        trend: list[float] = []  # the service's RSS (MB) every 25 transfers
        lock = threading.Lock()
        failures: list[str] = []
        began = time.monotonic()

        def killer() -> None:
            for index in kills:
                # when the log shows the index-th transfer beginning (counted over every run's log)
                service.wait_count(lambda event: event.get("event") == "transfer", index + 1, seconds=600)
                service.kill()
                service.start()

        def client_loop(name: str) -> None:
            try:
                client_transfers(name)
            except Exception as exc:
                with lock:
                    failures.append(f"client {name}: the soak failed: {exc!r}")

        def client_transfers(name: str) -> None:
            nonlocal done_count
            for transfer in (t for t in transfers if t.client == name):
                for _ in range(6 + args.service_kills):  # each kill of the service may fail one run
                    code, last, killed = send_once(transfer, port, tmp / "keys" / f"{name}.key")
                    transfer.attempts.append((code, last))
                    if code == 0:
                        transfer.stored = True
                        break
                    if not killed and not last.startswith("sendstream:"):
                        with lock:
                            failures.append(f"transfer {transfer.index}: a failure not reported: exit {code}, {last!r}")
                with lock:
                    done_count += 1
                    if done_count == args.rss_from:
                        rss["from"] = service.rss()
                    if done_count % 25 == 0:
                        trend.append(round(service.rss() / 1e6, 1))

        with Knockers(port, tmp, random.Random(args.seed + 1)) as knockers:
            threads = [threading.Thread(target=client_loop, args=(name,)) for name in clients]
            kill_thread = threading.Thread(target=killer, daemon=True)
            kill_thread.start()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            kill_thread.join(5)
        rss["to"] = service.rss()
        seconds = time.monotonic() - began
        service.stop()
        failures += check(transfers, tmp / "places", service.events)
        growth = rss["to"] - rss.get("from", rss["to"])
        if growth >= args.rss_growth_mb * 1_000_000:
            failures.append(
                f"the service's RSS grew by {growth / 1e6:.1f} MB from transfer {args.rss_from} to the last"
            )
        if service.starts != args.service_kills + 1:
            failures.append(f"the service was started {service.starts} times, not {args.service_kills + 1}")
        codes: dict[str, int] = {}
        for t in transfers:
            for code, _ in t.attempts[:-1] if t.stored else t.attempts:
                codes[str(code)] = codes.get(str(code), 0) + 1
        return {
            "transfers": len(transfers),
            "stored": sum(t.stored for t in transfers),
            "bytes": sum(len(t.data) for t in transfers),
            "sender_runs": sum(len(t.attempts) for t in transfers),
            "senders_killed": sum(t.cut is not None for t in transfers),
            "failed_runs_by_exit_code": codes,
            "service_kills": len(kills),
            "knocks": dict(knockers.counts),
            "refused_logged": sum(ev.get("event") == "refused" for ev in service.events),
            "rss_mb": {k: round(v / 1e6, 1) for k, v in rss.items()},
            "rss_growth_mb": round(growth / 1e6, 2),
            "rss_every_25_transfers_mb": trend,
            "seconds": round(seconds, 1),
            "failures": failures,
        }


def check(transfers: list[Transfer], places: Path, events: list[dict[str, object]]) -> list[str]:
    """What must hold of the places once the service stopped (``events``: the service's log, to tell of a
    stream that is not what was sent)."""
    failures = []
    expected: dict[str, set[str]] = {}
    for t in transfers:
        if not t.stored:
            failures.append(f"transfer {t.index} was never stored: {t.attempts}")
            continue
        expected.setdefault(t.client, set()).update({t.name, t.name + ".json"})
        path = places / t.client / t.name
        if not path.exists() or path.read_bytes() != t.data:
            logged = [ev for ev in events if t.name.split(".")[0] in json.dumps(ev)]
            failures.append(f"transfer {t.index}: {path} is not the stream sent: {difference(path, t)}; log {logged}")
            continue
        note = json.loads((places / t.client / (t.name + ".json")).read_text())
        if note["size"] != len(t.data) or note["sha256"] != hashlib.sha256(t.data).hexdigest():
            failures.append(f"transfer {t.index}: its manifest does not describe it")
        with open(path, "rb") as f:
            report = verify_file(f)
        if report.problems:
            failures.append(f"transfer {t.index}: verify: {report.problems[0]}")
    for client_dir in places.iterdir():
        left = {p.name for p in client_dir.iterdir()} - expected.get(client_dir.name, set())
        if left:
            failures.append(f"{client_dir}: left behind: {sorted(left)[:5]}")
    return failures


def difference(path: Path, t: Transfer) -> str:
    """How the file at ``path`` differs from transfer ``t``'s stream, and what its sender and manifest said:
    what a failure of this kind needs to be understood after the soak's directory is gone."""
    manifest = path.with_name(path.name + ".json")
    said = f"runs {t.attempts}, " + (f"manifest {manifest.read_text()[:300]!r}" if manifest.exists() else "no manifest")
    if not path.exists():
        return f"missing ({said}; the place holds {sorted(p.name for p in path.parent.iterdir())[:8]})"
    data = path.read_bytes()
    at = next((i for i, (a, b) in enumerate(zip(data, t.data, strict=False)) if a != b), min(len(data), len(t.data)))
    return f"{len(data)} bytes of {len(t.data)}, first difference at {at} ({said})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transfers", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--service-kills", type=int, default=2)
    parser.add_argument("--rss-growth-mb", type=int, default=10)
    parser.add_argument("--rss-from", type=int, default=50, help="the transfer after which the RSS is first read")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key, value in result.items():
            if key != "failures":
                print(f"{key}: {value}")
        for failure in result["failures"]:  # type: ignore[attr-defined]
            print(f"FAIL: {failure}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
