"""Several ``sendstream serve`` with one configuration and one bucket, behind a real TCP load balancer
(HAProxy), against a real S3 server (SeaweedFS): any service takes any client, a transfer cut by
killing its service resumes on another from the state in the bucket, and every stream is stored once."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.balancer import haproxy
from support.net import CMD, free_port, key_file, wait_listening
from support.s3 import Store, seaweedfs

from sendstream import Command, encode_command, encode_stream_header
from sendstream import errors as e
from sendstream.archive.lease import Lease
from sendstream.archive.store import Location
from sendstream.transfer.identity import stream_identity
from sendstream.transfer.stored import stream_name

pytestmark = pytest.mark.system
CLIENTS = ("alpha", "beta", "gamma", "delta")
MIB = 1 << 20


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as running:
        yield running


def a_stream(path: Path, mib: int) -> bytes:
    """A full stream of its own subvolume, of ``mib`` MiB of writes (random: nothing compresses it)."""
    out = [encode_stream_header(2)]
    out.append(encode_command(Command.build("subvol", [("path", b"s"), ("uuid", uuid.uuid4()), ("ctransid", 7)]), 2))
    out.append(encode_command(Command.build("mkfile", [("path", b"f"), ("ino", 257)]), 2))
    block = os.urandom(1 << 16)
    for i in range(mib * 16):
        write = Command.build("write", [("path", b"f"), ("file_offset", i << 16), ("data", block)])
        out.append(encode_command(write, 2))
    out.append(encode_command(Command.build("end", []), 2))
    data = b"".join(out)
    path.write_bytes(data)
    return data


class Service:
    """One ``sendstream serve`` process, its log (JSON lines) gathered in a thread."""

    def __init__(self, config: Path, port: int, env: dict[str, str], metrics: int) -> None:
        argv = [*CMD, "serve", "--config", str(config), "--log-format", "json", "--metrics", f"127.0.0.1:{metrics}"]
        self.process = subprocess.Popen(argv, stderr=subprocess.PIPE, env=env, start_new_session=True)
        self.port, self.metrics, self.lines = port, metrics, list[dict[str, object]]()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_listening(port)

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(json.loads(line))

    def transfers(self, client: str) -> list[dict[str, object]]:
        return [x for x in self.lines if x.get("event") == "transfer" and x.get("client") == client]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
        self.process.wait(60)
        self._reader.join(10)


def _scrape(port: int) -> dict[tuple[str, str], float]:
    """``sendstream_transfers_total`` of one service, by client and result."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = {}
    for line in text.splitlines():
        if match := re.fullmatch(r'sendstream_transfers_total\{client="(\w+)",result="(\w+)"\} (\S+)', line):
            found[match[1], match[2]] = float(match[3])
    return found


def test_a_transfer_cut_by_killing_its_service_resumes_on_another_and_every_stream_is_stored_once(
    store: Store, tmp_path: Path
) -> None:
    bucket = store.bucket()
    ports = [free_port(), free_port()]
    front = free_port()
    (tmp_path / "keys").mkdir()
    clients = ""
    for name in CLIENTS:
        key_file(tmp_path / "keys" / f"{name}.key")
        clients += f'[clients.{name}]\nkey = "keys/{name}.key"\nstore = "s3://{bucket}/{name}"\n'
    configs = []
    for n, port in enumerate(ports):  # one configuration: only where each listens differs
        configs.append(tmp_path / f"serve{n}.toml")
        configs[-1].write_text(f'listen = "127.0.0.1:{port}"\nproxy_from = ["127.0.0.2"]\n{clients}')
    # alpha's is longer than the sender's resend window (64 MiB): acknowledged by completed parts, it goes on
    streams = {name: a_stream(tmp_path / f"{name}.stream", 80 if name == "alpha" else 48) for name in CLIENTS}
    # HAProxy connects from 127.0.0.2, the services take a PROXY header from there only; direct
    # connections (from 127.0.0.1) are clients of their own
    services = [Service(c, p, store.env, free_port()) for c, p in zip(configs, ports, strict=True)]
    senders: dict[str, subprocess.Popen[bytes]] = {}
    try:
        line = "    server s{} 127.0.0.1:{} source 127.0.0.2 send-proxy-v2 check inter 300ms fall 1 rise 2\n"
        with haproxy(tmp_path, front, "".join(line.format(n, p) for n, p in enumerate(ports))):
            for name in CLIENTS:
                argv = [
                    *CMD, "send", "--to", f"127.0.0.1:{front}", str(tmp_path / f"{name}.stream"),
                    "--key", str(tmp_path / "keys" / f"{name}.key"), "--identity", name,
                    "--resumable", "--retries", "12", "--rate-limit", "6M", "--progress", "none",
                ]  # fmt: skip
                senders[name] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=store.env)
            # the event: a state in the bucket with a part completed, of a transfer the first service runs
            client = store.client()
            deadline = time.monotonic() + 120
            victim = None
            while victim is None:
                assert time.monotonic() < deadline, [s.lines for s in services]
                for name in CLIENTS:
                    state = f"{name}/{stream_name(stream_identity(streams[name][: 64 << 10]))}.upload"
                    with contextlib.suppress(Exception):
                        held = json.loads(client.get_object(Bucket=bucket, Key=state)["Body"].read())
                        if held["state"]["parts"] and services[0].transfers(name):
                            victim = name
                            break
                time.sleep(0.05)
            services[0].stop(signal.SIGKILL)
            results = {name: (*p.communicate(timeout=240), p.returncode) for name, p in senders.items()}
            services[0] = Service(configs[0], ports[0], store.env, free_port())  # it comes back
            again, twice = a_stream(tmp_path / "again.stream", 24), {}
            for n, port in enumerate(ports):  # the same new stream to both at once: stored once
                argv = [
                    *CMD, "send", "--to", f"127.0.0.1:{port}", str(tmp_path / "again.stream"),
                    "--key", str(tmp_path / "keys" / "alpha.key"), "--identity", "alpha",
                    "--resumable", "--retries", "12", "--rate-limit", "8M", "--progress", "none",
                ]  # fmt: skip
                twice[n] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=store.env)
            both = [(*p.communicate(timeout=240), p.returncode) for p in twice.values()]
            key = str(tmp_path / "keys" / "alpha.key")
            listings = [
                subprocess.run(
                    [*CMD, "send", "--list", "--to", f"127.0.0.1:{port}", "--key", key, "--identity", "alpha"],
                    capture_output=True,
                    env=store.env,
                    timeout=60,
                )
                for port in ports
            ]
            scraped = [_scrape(s.metrics) for s in services]
    finally:
        for sender in senders.values():
            if sender.poll() is None:
                sender.kill()
                sender.wait()
        for service in services:
            service.stop()
    assert all(code == 0 for _, _, code in results.values()), results
    assert [code for _, _, code in both] == [0, 0], [err.decode() for _, err, _ in both]
    assert sorted(b"already stored" in out + err for out, err, _ in both) == [False, True], both
    assert all(x.returncode == 0 for x in listings), listings
    assert listings[0].stdout == listings[1].stdout and listings[0].stdout.count(b"\n") == 2, listings
    for name in CLIENTS:  # each service counts its own; their sum is every transfer the logs say ended well
        ok = sum(1 for s in services for x in s.lines if x.get("event") == "stored" and x.get("client") == name)
        assert sum(m.get((name, "ok"), 0) for m in scraped) == ok, (name, scraped)
    resumed = [x for x in services[1].transfers(victim) if x.get("resumed")]
    assert resumed and int(str(resumed[0]["resumed"])) >= 8 * MIB, services[1].lines  # not sent again
    listed = {o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
              for o in page.get("Contents", [])}  # fmt: skip
    expected = set()
    for name, data in [*streams.items(), ("alpha", again)]:
        stored = stream_name(stream_identity(data[: 64 << 10]))
        expected |= {f"{name}/{stored}", f"{name}/{stored}.json"}
        restored = subprocess.run(
            [*CMD, "restore", f"s3://{bucket}/{name}/{stream_identity(data[:65536])['uuid']}", "-o", "-"],
            capture_output=True,
            env=store.env,
        )
        assert restored.returncode == 0 and restored.stdout == data, (name, restored.stderr)
        checked = subprocess.run([*CMD, "verify", f"s3://{bucket}/{name}"], capture_output=True, env=store.env)
        assert checked.returncode == 0, checked
    assert listed == expected  # each once; no state, claim or second object left
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_claim_is_one_service_s_until_it_lapses_and_is_never_deleted_by_another(store: Store) -> None:
    bucket, client = store.bucket(), store.client()
    where, now = Location(bucket, "c/"), [1000.0]
    clock = lambda: now[0]  # noqa: E731
    first = Lease(client, where, "S.stream", "first", clock=clock, seconds=20)
    second = Lease(client, where, "S.stream", "second", clock=clock, seconds=20)
    with ThreadPoolExecutor(8) as pool:  # many at once: the store keeps one
        racers = [Lease(client, where, "R.stream", f"r{n}", clock=clock) for n in range(8)]
        taken = list(pool.map(lambda lease: _took(lease), racers))
    assert sum(taken) == 1, taken
    first.take()
    with pytest.raises(e.SessionError, match=r"busy: another service \(first\) .* lapses in 20 s"):
        second.take()
    now[0] += 21  # the first renews no more (killed): its claim lapses, the second takes it over
    second.take()
    lost: list[str] = []
    first.hold(lost.append, itertools.count().__next__)  # a renewal finds it taken: the first hears so
    deadline = time.monotonic() + 30
    while not lost:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert lost == ["another service took the claim over"]
    first.release()  # not the first's any more: left to the second
    assert json.loads(client.get_object(Bucket=bucket, Key="c/S.stream.claim")["Body"].read())["holder"] == "second"
    second.release()
    with pytest.raises(Exception, match=r"NoSuchKey|404"):
        client.head_object(Bucket=bucket, Key="c/S.stream.claim")


def _took(lease: Lease) -> bool:
    try:
        lease.take()
    except e.SessionError:
        return False
    return True


def test_a_claim_is_let_go_when_its_transfer_stands_still_and_a_forged_one_is_taken_over(store: Store) -> None:
    bucket, client = store.bucket(), store.client()
    where = Location(bucket, "c/")
    client.put_object(Bucket=bucket, Key="c/F.stream.claim", Body=b'{"holder": "x", "nonce": "n", "until": 1e308}')
    forged = Lease(client, where, "F.stream", "ours")
    forged.take()  # a claim that says it holds for ever is no lease of ours: lapsed
    still: list[str] = []
    stalled = Lease(client, where, "S.stream", "still", seconds=1.0, renew=0.2)
    stalled.take()
    stalled.hold(still.append, lambda: 0)  # nothing moves: a sender gone without a word
    deadline = time.monotonic() + 30
    while not still:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert still[0].startswith("nothing moved for "), still
    stalled.release()
    forged.release()
    gone = Lease(client, Location("no-such-bucket-here", "c/"), "G.stream", "gone")
    gone.release()  # never an error: a claim that cannot be deleted lapses


def _parts(client: Any, bucket: str, key: str) -> int:
    """How many parts the upload state at ``key`` names (0: none, or no state)."""
    try:
        return len(json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())["state"]["parts"])
    except Exception:
        return 0


def test_a_continued_upload_cut_again_goes_on_for_its_sender_and_starts_over_for_a_new_one(
    store: Store, tmp_path: Path
) -> None:
    """A continuing service knows no ledger of the part it did not see: the same sender follows it after a
    second kill; a new sender process cannot check its stream there, so that state goes and its next run
    stores the stream whole."""
    bucket, client, port = store.bucket(), store.client(), free_port()
    key_file(tmp_path / "alpha.key")
    config = tmp_path / "serve.toml"
    config.write_text(f'listen = "127.0.0.1:{port}"\n[clients.alpha]\nkey = "alpha.key"\nstore = "s3://{bucket}/a"\n')
    data = a_stream(tmp_path / "s.stream", 64)
    state = f"a/{stream_name(stream_identity(data[: 64 << 10]))}.upload"
    argv = [
        *CMD, "send", "--to", f"127.0.0.1:{port}", str(tmp_path / "s.stream"), "--key", str(tmp_path / "alpha.key"),
        "--identity", "alpha", "--resumable", "--retries", "12", "--rate-limit", "6M", "--progress", "none",
    ]  # fmt: skip
    services = [Service(config, port, store.env, free_port())]
    sender = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=store.env)
    try:
        for want in (1, 3):  # a kill once a part is in the state, then once the next service saved two more
            deadline = time.monotonic() + 120
            while _parts(client, bucket, state) < want:
                assert time.monotonic() < deadline and sender.poll() is None, sender.poll()
                time.sleep(0.05)
            services[-1].stop(signal.SIGKILL)
            services.append(Service(config, port, store.env, free_port()))  # another service, at that address
            deadline = time.monotonic() + 120
            while not [x for x in services[-1].lines if x.get("event") == "transfer"]:
                assert time.monotonic() < deadline and sender.poll() is None, sender.poll()
                time.sleep(0.05)
        services[-1].stop(signal.SIGKILL)
        sender.kill()  # the sender too: a new process comes instead
        sender.wait()
        services.append(Service(config, port, store.env, free_port()))
        fresh = subprocess.run(argv, capture_output=True, env=store.env, timeout=240)
        assert fresh.returncode != 0 and b"already has" in fresh.stderr, fresh.stderr
        assert _parts(client, bucket, state) == 0  # gone, with its upload
        again = subprocess.run(argv, capture_output=True, env=store.env, timeout=240)
        assert again.returncode == 0, again.stderr
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
        for service in services:
            service.stop()
    restored = subprocess.run(
        [*CMD, "restore", f"s3://{bucket}/a/{stream_identity(data[:65536])['uuid']}", "-o", "-"],
        capture_output=True,
        env=store.env,
    )
    assert restored.returncode == 0 and restored.stdout == data, restored.stderr
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
