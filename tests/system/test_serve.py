"""``sendstream serve``: many clients at once, each in its own place; no client ends the service."""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import io
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.btrfs import need_root_btrfs
from support.loopfs import btrfs_loop
from support.net import CMD, free_port, key_file, listening, wait_listening
from support.storing import running, sending, service, serving
from support.streams import FIXTURES
from support.trees import differences, tree_state

from sendstream import Command, encode_command, encode_stream_header
from sendstream.service.config import load
from sendstream.service.log import EventLog
from sendstream.service.server import Service
from sendstream.session.connection import Inbox
from sendstream.session.protocol import Answer, Data, Hello, SenderConnection
from sendstream.stores import files
from sendstream.transfer.identity import first_command, stream_identity
from sendstream.transfer.journal import PART_SUFFIX, load_state
from sendstream.transfer.stored import stream_name
from sendstream.transport.listener import MAX_PER_SOURCE
from sendstream.transport.tls import Channel, connect_channel, load_key

FULL = FIXTURES / "rich-full-v2.stream"
INCR = FIXTURES / "rich-incr-v2.stream"
CLIENTS = ("alpha", "beta", "gamma", "delta")


def write_config(tmp_path: Path, port: int, extra: str = "", clients: tuple[str, ...] = CLIENTS) -> Path:
    (tmp_path / "keys").mkdir(exist_ok=True)
    text = f'listen = "127.0.0.1:{port}"\n{extra}\n'
    for name in clients:
        key_file(tmp_path / "keys" / f"{name}.key")
        (tmp_path / "places" / name).mkdir(parents=True, exist_ok=True)
        text += f'[clients.{name}]\nkey = "keys/{name}.key"\nstore = "places/{name}"\n'
    config = tmp_path / "serve.toml"
    config.write_text(text)
    return config


def events(proc: subprocess.Popen[bytes]) -> list[dict[str, object]]:
    assert proc.stderr is not None
    return [json.loads(line) for line in proc.stderr.read().decode().splitlines()]


def send(
    port: int, tmp_path: Path, client: str, stream: Path, *extra: str, identity: str | None = None
) -> subprocess.CompletedProcess[bytes]:
    key = tmp_path / "keys" / f"{client}.key"
    argv = [*CMD, "send", "--to", f"127.0.0.1:{port}", str(stream), "--key", str(key), "--identity", identity or client]
    return subprocess.run([*argv, "--progress", "none", *extra], capture_output=True, timeout=120)


def stored(tmp_path: Path, client: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (tmp_path / "places" / client).iterdir()}


def name_of(stream: Path) -> str:
    return stream_name(stream_identity(stream.read_bytes()[: 64 << 10]))


def test_many_clients_at_once_while_others_attack(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, clients=(*CLIENTS, "idle"))
    with service(config, port) as proc:
        attackers = [
            threading.Thread(target=_silent, args=(port, 3.0)),
            threading.Thread(target=_garbage, args=(port, 20 << 20)),
            threading.Thread(target=_garbage, args=(port, 100)),
        ]
        for a in attackers:
            a.start()
        jobs = [
            (client, stream, extra)
            for client in CLIENTS
            for stream, extra in ((FULL, ()), (INCR, ("--resumable", "--compress", "zstd")))
        ]
        results: dict[int, subprocess.CompletedProcess[bytes]] = {}

        def run(i: int) -> None:
            client, stream, extra = jobs[i]
            results[i] = send(port, tmp_path, client, stream, *extra)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        wrong = send(port, tmp_path, "alpha", FULL, identity="beta")  # alpha's key, beta's name
        for t in threads + attackers:
            t.join(120)
        assert proc.poll() is None, "a client ended the service"
        listed = [send(port, tmp_path, client, FULL, "--list", "--json") for client in CLIENTS]
        idle = send(port, tmp_path, "idle", FULL, "--list", "--json")
    assert all(r.returncode == 0 for r in results.values()), [r.stderr for r in results.values()]
    assert wrong.returncode == 6 and b"wrong key or identity" in wrong.stderr, wrong.stderr
    for client in CLIENTS:
        held = stored(tmp_path, client)
        assert held[name_of(FULL)] == FULL.read_bytes() and held[name_of(INCR)] == INCR.read_bytes()
        assert sorted(held) == sorted([name_of(FULL), name_of(FULL) + ".json", name_of(INCR), name_of(INCR) + ".json"])
        note = json.loads(held[name_of(INCR) + ".json"])
        assert note["client"] == client and note["size"] == INCR.stat().st_size and note["commands"] > 0
        assert note["stream"]["parent_uuid"] == stream_identity(FULL.read_bytes()[:65536])["uuid"]
    assert idle.returncode == 0 and idle.stdout == b""  # each client's own only
    for result in listed:
        snapshots = [json.loads(line) for line in result.stdout.splitlines()]
        assert result.returncode == 0 and sorted(s["name"] for s in snapshots) == sorted([name_of(FULL), name_of(INCR)])
        incr = next(s for s in snapshots if s["name"] == name_of(INCR))
        assert incr["parent_uuid"] == stream_identity(FULL.read_bytes())["uuid"] and incr["parent_ctransid"] == 7
        assert sorted(s["snapshot"] for s in snapshots) == ["rich_base", "rich_incr"]  # the snapshots' own names
        assert all(s["arrived"] == s["stored"] for s in snapshots)
    log = events(proc)
    assert proc.returncode == 0
    assert sum(e["event"] == "stored" for e in log) == len(jobs)
    reasons = " ".join(str(e.get("reason")) for e in log if e["event"] == "refused")
    assert "wrong key or identity" in reasons, reasons
    assert "which no client's trusted addresses hold: send with --tls tls13-aes128-gcm" in reasons, reasons  # garbage
    assert log[-1]["event"] == "stopped"


def _silent(port: int, seconds: float) -> None:
    with socket.create_connection(("127.0.0.1", port)):
        time.sleep(seconds)


def _garbage(port: int, size: int) -> None:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as sock:
        chunk = b"x" * (1 << 20)
        sent = 0
        while sent < size:
            sock.sendall(chunk[: size - sent])
            sent += len(chunk)


def test_a_bad_stream_leaves_nothing_in_the_place(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    damaged = tmp_path / "damaged.stream"
    data = bytearray(FULL.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(data)
    with service(config, port) as proc:
        told = raw_tls_send(port, tmp_path / "keys" / "alpha.key", "alpha", bytes(data))  # sendstream send checks first
        good = send(port, tmp_path, "alpha", FULL)
    assert told.startswith(b"sendstream-status 1 ") and b"crc32c mismatch" in told, told
    assert good.returncode == 0, good.stderr
    assert sorted(stored(tmp_path, "alpha")) == [name_of(FULL), name_of(FULL) + ".json"]  # no hidden file left
    failed = [e for e in events(proc) if e["event"] == "failed"]
    assert len(failed) == 1 and failed[0]["client"] == "alpha" and "crc32c mismatch" in str(failed[0]["reason"])


def _named_as(stream: Path, tmp_path: Path) -> Path:
    """Another valid stream with the name of ``stream``: its first command, and END."""
    other = tmp_path / "other.stream"
    first = first_command(stream.read_bytes())[1]
    assert first is not None
    other.write_bytes(_crafted(first))
    return other


def test_the_same_stream_again_is_already_stored_and_another_of_its_name_is_refused(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    other = _named_as(FULL, tmp_path)
    with service(config, port) as proc:
        first = send(port, tmp_path, "alpha", FULL)
        note = stored(tmp_path, "alpha")[name_of(FULL) + ".json"]
        again = send(port, tmp_path, "alpha", FULL, "--resumable")  # a session this time, through its journal
        refused = send(port, tmp_path, "alpha", other)
        resent = send(port, tmp_path, "alpha", other, "--resumable")
        held = stored(tmp_path, "alpha")
        (tmp_path / "places" / "alpha" / (name_of(FULL) + ".json")).unlink()  # as if cut between the renames
        healed = send(port, tmp_path, "alpha", FULL)
    assert first.returncode == 0 and b"receiver says" not in first.stderr, first.stderr
    assert again.returncode == 0, again.stderr
    assert f"the receiver says: already stored: {name_of(FULL)} holds these same bytes".encode() in again.stderr
    for result in (refused, resent):
        assert result.returncode == 2, result.stderr
        assert f"{name_of(FULL)}: a stream of this name is stored already, with other bytes".encode() in result.stderr
    assert sorted(held) == [name_of(FULL), name_of(FULL) + ".json"]  # no journal, no hidden file left
    assert held[name_of(FULL)] == FULL.read_bytes() and held[name_of(FULL) + ".json"] == note
    assert healed.returncode == 0, healed.stderr
    assert json.loads(stored(tmp_path, "alpha")[name_of(FULL) + ".json"])["sha256"] == json.loads(note)["sha256"]
    log = events(proc)
    assert [e.get("already") for e in log if e["event"] == "stored"] == [None, True, True]
    assert [e["code"] for e in log if e["event"] == "failed"] == [2, 2]


def test_two_transfers_of_one_name_at_once_store_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both have received their whole stream (a barrier holds each before it names its own); one is stored,
    the other, with other bytes, refused."""
    barrier, naming = threading.Barrier(2, timeout=60), files._named

    def together(*args: Any) -> Any:
        barrier.wait()
        return naming(*args)

    monkeypatch.setattr(files, "_named", together)
    other = _named_as(FULL, tmp_path)
    with serving(tmp_path) as (port, log):
        senders = [subprocess.Popen(sending(port, tmp_path, s), stderr=subprocess.PIPE) for s in (FULL, other)]
        said = [p.communicate(timeout=120)[1] for p in senders]
    codes = [p.returncode for p in senders]
    assert sorted(codes) == [0, 2], said
    won = (FULL, other)[codes.index(0)]
    held = {p.name: p.read_bytes() for p in (tmp_path / "places" / "alpha").iterdir()}
    assert sorted(held) == [name_of(FULL), name_of(FULL) + ".json"] and held[name_of(FULL)] == won.read_bytes()
    assert json.loads(held[name_of(FULL) + ".json"])["size"] == won.stat().st_size
    assert b"a stream of this name is stored already, with other bytes" in said[codes.index(2)]
    assert sorted(str(e["event"]) for e in log.events() if e["event"] in ("stored", "failed")) == ["failed", "stored"]


def test_stored_streams_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """Plain and resumable (journaled) sends, under umask 022: every file of the place is 0600."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    umask = os.umask(0o022)
    try:
        with service(config, port):
            results = [send(port, tmp_path, "alpha", FULL, "--resumable"), send(port, tmp_path, "alpha", INCR)]
    finally:
        os.umask(umask)
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in (tmp_path / "places" / "alpha").iterdir()}
    names = [name for stream in (FULL, INCR) for name in (name_of(stream), name_of(stream) + ".json")]
    assert modes == dict.fromkeys(names, "0o600")


def tls_channel(port: int, key: Path, identity: str) -> Channel:
    """A TLS channel of the library to the service, with ``key`` and ``identity``."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(20)
    return connect_channel(sock, "tls13-aes128-gcm", load_key(key), identity)


def raw_tls_send(port: int, key: Path, identity: str, data: bytes) -> bytes:
    """``data`` as a raw stream through a TLS channel of the library (no checks first); the status line."""
    with tls_channel(port, key, identity) as channel:
        with contextlib.suppress(OSError):
            channel.send_all(data)
            channel.shutdown_write()
        buf = bytearray(4096)
        return bytes(buf[: channel.recv_into(buf)])


def test_a_client_over_its_limit_is_told_busy(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, "max_per_client = 1", clients=("alpha",))
    big = tmp_path / "big.stream"
    big.write_bytes(FULL.read_bytes() * 8)
    with service(config, port) as proc:
        slow = threading.Thread(target=send, args=(port, tmp_path, "alpha", big, "--rate-limit", "400K"))
        slow.start()
        time.sleep(1.0)
        second = send(port, tmp_path, "alpha", FULL)
        slow.join(60)
    assert second.returncode == 4 and b"busy: alpha already has 1 transfer running" in second.stderr, second.stderr
    log = events(proc)
    assert any(e["event"] == "refused" and "already has 1 transfer" in str(e["reason"]) for e in log), log


@pytest.mark.parametrize(
    ("body", "where", "message"),
    [
        ('lisen = "x"\n', ":1", "unknown setting 'lisen'"),
        ('tls = "none"\n', ":1", "tls: expected one of"),
        ("max_transfers = 0\n", ":1", "max_transfers: expected a whole number from 1"),
        ("[clients.alpha\n", ":1", "not TOML"),
        ('[clients."../x"]\nkey = "k"\nstore = "."\n', ":1", "client name '../x': expected 1 to 64 letters"),
        ('[clients."a/b"]\nkey = "k"\nstore = "."\n', ":1", "client name 'a/b'"),
        ('[clients."a\\u0000b"]\nkey = "k"\nstore = "."\n', "", "client name 'a\\x00b'"),
        ('[clients.alpha]\nkey = "missing.key"\nstore = "."\n', ":2", "cannot read key file"),
        ('[clients.alpha]\nkey = "open.key"\nstore = "."\n', ":2", "accessible by group or others"),
        ('[clients.alpha]\nkey = "k"\nstore = "nowhere"\n', ":3", "is not a directory"),
        ('[clients.alpha]\nkey = "k"\n', ":1", "clients.alpha: expected one of store (stream files) or receive"),
        ('[clients.alpha]\nkey = "k"\nstore = "p"\nreceive = "p"\n', ":1", "not both nor neither"),
        ('[clients.alpha]\nkey = "k"\nreceive = "p"\n', ":3", "not on btrfs"),
        ('[clients.alpha]\nkey = "k"\nstore = "p"\n[clients.beta]\nkey = "k2"\nstore = "p/in"\n', ":6", "is inside"),
        ('[clients.alpha]\nkey = "k"\nstore = "p"\nwho = 1\n', ":4", "unknown setting 'who'"),
        ('[clients.alpha]\nkey = "k"\nstore = "p"\ntrusted = ["lan"]\n', ":4", "'lan' is not an address or a network"),
        ('[clients.alpha]\nkey = "k"\nstore = "p"\ntrusted = "10.0.0.1"\n', ":4", "expected a list of addresses"),
        (
            '[clients.alpha]\nkey = "k"\nstore = "p"\ntrusted = ["10.1.0.0/16"]\n'
            '[clients.beta]\nkey = "k2"\nstore = "q"\ntrusted = ["10.1.2.3"]\n',
            ":8",
            "clients.beta.trusted '10.1.2.3/32' overlaps clients.alpha.trusted '10.1.0.0/16'",
        ),
        (
            '[clients.alpha]\nkey = "k"\nstore = "p"\ntrusted = ["::ffff:10.1.0.0/112"]\n'
            '[clients.beta]\nkey = "k2"\nstore = "q"\ntrusted = ["10.1.2.3"]\n',
            ":8",
            "clients.beta.trusted '10.1.2.3/32' overlaps clients.alpha.trusted '10.1.0.0/16'",
        ),
        ("", "", "no clients"),
        ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "", "not TOML: arrays or tables nested too deeply"),
        ("max_transfers = " + "9" * 5000 + "\n", ":1", "not TOML: an integer of more than 4300 digits"),
        ("max_transfers = 0x" + "f" * 5000 + "\n", ":1", "from 1 to 4096, got an integer of 20000 bits"),
        (
            '[clients.alpha]\nkey = "k\\u0000x"\nstore = "p"\n',
            ":2",
            "clients.alpha.key: expected a non-empty string without NUL",
        ),
        (
            '[clients.alpha]\nkey = "k"\nstore = "p\\u0000x"\n',
            ":3",
            "clients.alpha.store: expected a non-empty string without NUL",
        ),
        (
            '[clients.alpha]\nkey = "k"\nreceive = "p\\u0000"\n',
            ":3",
            "clients.alpha.receive: expected a non-empty string without NUL",
        ),
        (
            '[clients.alpha]\nkey = "k"\nstore = "p"\n[clients.beta]\nkey = "./k"\nstore = "q"\n',
            ":5",
            "/k' is also clients.alpha's key file: each client needs a key of its own",
        ),
        (
            '[clients.alpha]\nkey = "k"\nstore = "p"\n[clients.beta]\nkey = "k-copy"\nstore = "q"\n',
            ":5",
            "k-copy' holds the same key as clients.alpha's",
        ),
        (
            'listen = "[::1:7000"\n[clients.alpha]\nkey = "k"\nstore = "p"\n',
            ":1",
            "listen: expected HOST:PORT or [IPv6]:PORT, got '[::1:7000'",
        ),
        (
            '[clients.alpha]\nkey = "k"\nstore = "p"\nquota = "lots"\n',
            ":4",
            "clients.alpha.quota: expected a size in bytes",
        ),
        (
            '[clients.alpha]\nkey = "k"\nstore = "s3://bucket/x"\nquota = "5G"\n',
            ":4",
            "clients.alpha.quota: only for a directory",
        ),
        ("journal_days = -1\n", ":1", "journal_days: expected days from 0.0 to 3650.0, got -1"),
        ("#" + "x" * (1 << 20) + "\n", "", "larger than 1048576 bytes: not a configuration"),
    ],
    ids=[
        "unknown-setting",
        "tls-none",
        "zero-transfers",
        "not-toml",
        "dotdot",
        "slash",
        "nul",
        "missing-key",
        "open-key",
        "no-place",
        "no-place-kind",
        "store-and-receive",
        "receive-not-btrfs",
        "nested-places",
        "client-setting",
        "trusted-not-an-address",
        "trusted-not-a-list",
        "trusted-overlap",
        "trusted-mapped-overlap",
        "no-clients",
        "deep-nesting",
        "5000-digits",
        "20000-bits",
        "nul-in-key",
        "nul-in-store",
        "nul-in-receive",
        "one-key-file-two-clients",
        "one-key-two-files",
        "listen-unclosed-bracket",
        "quota-not-a-size",
        "quota-of-a-bucket",
        "journal-days-negative",
        "over-1-MiB",
    ],
)
def test_check_config_names_the_line_and_what_is_wrong(tmp_path: Path, body: str, where: str, message: str) -> None:
    key_file(tmp_path / "k")
    key_file(tmp_path / "k2")
    (tmp_path / "k-copy").write_bytes((tmp_path / "k").read_bytes())
    (tmp_path / "k-copy").chmod(0o600)
    (tmp_path / "open.key").write_bytes(os.urandom(32))
    (tmp_path / "open.key").chmod(0o644)
    (tmp_path / "p" / "in").mkdir(parents=True)
    (tmp_path / "q").mkdir()
    config = tmp_path / "serve.toml"
    own = "listen" in body or "lisen" in body
    config.write_text(body if own else 'listen = "127.0.0.1:7000"\n' + body)
    offset = 0 if own else 1  # the listen line comes first
    result = subprocess.run([*CMD, "serve", "--config", str(config), "--check-config"], capture_output=True)
    text = result.stderr.decode()
    assert result.returncode == 2 and "Traceback" not in text, text
    line = f":{int(where[1:]) + offset}" if where else ""
    assert f"{config}{line}: " in text and message in text, text


def test_check_config_names_ext4_among_ext2_3_4(tmp_path: Path) -> None:
    """statfs gives ext2, ext3 and ext4 one magic number, which `stat -f` calls ext2/ext3: a receive place on
    a real ext4 (a loop device, mounted in a mount namespace of the check's own) is said to be on ext2/3/4."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not shutil.which("unshare"):
        pytest.skip("needs root, mkfs.ext4 and unshare")
    image, place = tmp_path / "ext4.img", tmp_path / "place"
    subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(image)], check=True)
    place.mkdir()
    key_file(tmp_path / "k")
    config = tmp_path / "serve.toml"
    config.write_text(f'listen = "127.0.0.1:7000"\n[clients.alpha]\nkey = "k"\nreceive = "{place}"\n')
    check = shlex.join([*CMD, "serve", "--config", str(config), "--check-config"])
    mounted = f"mount -o loop {shlex.quote(str(image))} {shlex.quote(str(place))} && {check}"  # gone with it
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", mounted], capture_output=True
    )
    text = result.stderr.decode()
    assert result.returncode == 2 and "Traceback" not in text, text
    assert f"{config}:4: clients.alpha.receive: '{place}' is on ext2/3/4, not on btrfs" in text, text


def test_check_config_says_ok(tmp_path: Path) -> None:
    config = write_config(tmp_path, 7000)
    result = subprocess.run([*CMD, "serve", "--config", str(config), "--check-config"], capture_output=True)
    assert result.returncode == 0 and b": ok: 4 clients (alpha, beta, delta, gamma)" in result.stdout, result


def test_a_trusted_client_sends_unencrypted_from_its_addresses_only(tmp_path: Path) -> None:
    """`trusted` lets a client send with --tls none from those addresses; any other plain connection is refused."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha", "beta"))
    text = config.read_text()
    config.write_text(text.replace('store = "places/alpha"\n', 'store = "places/alpha"\ntrusted = ["127.0.0.0/8"]\n'))
    with service(config, port) as proc:
        plain = send(port, tmp_path, "alpha", FULL, "--tls", "none")
        listed = send(port, tmp_path, "alpha", FULL, "--tls", "none", "--list", "--json")
        encrypted = send(port, tmp_path, "alpha", INCR)  # the key still works, from anywhere
    assert plain.returncode == 0 and listed.returncode == 0 and encrypted.returncode == 0, (plain, listed, encrypted)
    assert stored(tmp_path, "alpha")[name_of(FULL)] == FULL.read_bytes()
    assert name_of(INCR) in stored(tmp_path, "alpha") and not stored(tmp_path, "beta")
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == [name_of(FULL)]
    log = events(proc)
    assert any(e["event"] == "client" and e.get("trusted") == "127.0.0.0/8" for e in log), log
    assert sum(e["event"] == "stored" and e["client"] == "alpha" for e in log) == 2, log

    # no client trusts 127.0.0.1 now: a plain sender is told why, and TLS senders go on
    config.write_text(text.replace('store = "places/alpha"\n', 'store = "places/alpha"\ntrusted = ["10.9.9.0/24"]\n'))
    with service(config, port) as proc:
        refused = send(port, tmp_path, "beta", FULL, "--tls", "none")
        fine = send(port, tmp_path, "beta", FULL)
    assert refused.returncode == 6, refused.stderr
    assert (
        b"unencrypted from 127.0.0.1:" in refused.stderr
        and b"which no client's trusted addresses hold" in refused.stderr
    )
    assert fine.returncode == 0 and stored(tmp_path, "beta")[name_of(FULL)] == FULL.read_bytes()
    assert any(e["event"] == "refused" and "unencrypted from 127.0.0.1" in str(e["reason"]) for e in events(proc))


def test_a_trusted_ipv4_mapped_network_is_its_ipv4_network(tmp_path: Path) -> None:
    """`::ffff:127.0.0.0/104` is taken as 127.0.0.0/8: on a dual-stack socket (`*`) a plain sender from
    127.0.0.1 (seen as ::ffff:127.0.0.1) gets in, where the mapped network could never match before."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    text = config.read_text().replace(f"127.0.0.1:{port}", f"*:{port}")
    config.write_text(
        text.replace('store = "places/alpha"\n', 'store = "places/alpha"\ntrusted = ["::ffff:127.0.0.0/104"]\n')
    )
    with service(config, port) as proc:
        plain = send(port, tmp_path, "alpha", FULL, "--tls", "none")
    assert plain.returncode == 0, plain.stderr
    assert stored(tmp_path, "alpha")[name_of(FULL)] == FULL.read_bytes()
    assert any(e["event"] == "client" and e.get("trusted") == "127.0.0.0/8" for e in events(proc))


# into btrfs receive: real btrfs on a loop device


def _crafted(*commands: Command) -> bytes:
    """A version-2 stream of ``commands`` and END, made by the project's encoder (the CRCs are right)."""
    body = b"".join(encode_command(c, 2) for c in (*commands, Command.build("end")))
    return encode_stream_header(2) + body


def _clone_from(source: uuid.UUID) -> Command:
    """A clone of 4 KiB of ``file`` in subvolume ``source`` (at ctransid 7) into ``f``."""
    attributes = [("path", b"f"), ("file_offset", 0), ("clone_len", 4096), ("clone_uuid", source)]
    return Command.build("clone", [*attributes, ("clone_ctransid", 7), ("clone_path", b"file"), ("clone_offset", 0)])


def _received_uuid(path: Path) -> str:
    shown = subprocess.run(["btrfs", "subvolume", "show", str(path)], capture_output=True, text=True, check=True)
    return next(line.split()[-1] for line in shown.stdout.splitlines() if "Received UUID" in line)


def _receive_config(tmp_path: Path, mnt: Path, port: int, clients: tuple[str, ...], extra: str = "") -> Path:
    """A service whose ``clients`` each receive into a directory of their name on ``mnt`` (``extra``: more
    settings of each)."""
    (tmp_path / "keys").mkdir(exist_ok=True)
    text = f'listen = "127.0.0.1:{port}"\n'
    for name in clients:
        (mnt / name).mkdir()
        key_file(tmp_path / "keys" / f"{name}.key")
        text += f'[clients.{name}]\nkey = "keys/{name}.key"\nreceive = "{mnt / name}"\n{extra}\n'
    config = tmp_path / "serve.toml"
    config.write_text(text)
    return config


@pytest.mark.btrfs
def test_into_btrfs_receive_each_client_is_confined_to_its_own_subvolumes(tmp_path: Path) -> None:
    need_root_btrfs()
    full_uuid = stream_identity(FULL.read_bytes()[:65536])["uuid"]
    with btrfs_loop("512M") as mnt:
        (mnt / "direct").mkdir()
        port = free_port()
        config = _receive_config(tmp_path, mnt, port, ("alpha", "beta"))
        evil = uuid.uuid4()
        attacks = {
            "clone-from-alpha": _crafted(
                Command.build("subvol", [("path", b"evil"), ("uuid", evil), ("ctransid", 1)]),
                Command.build("mkfile", [("path", b"f"), ("ino", 257)]),
                _clone_from(uuid.UUID(full_uuid)),
            ),
            "clone-after-data": _crafted(  # 25 MiB first: btrfs receive has begun the subvolume when the clone comes
                Command.build("subvol", [("path", b"evil3"), ("uuid", uuid.uuid4()), ("ctransid", 1)]),
                Command.build("mkfile", [("path", b"f"), ("ino", 257)]),
                *(
                    Command.build("write", [("path", b"f"), ("file_offset", i << 16), ("data", bytes(1 << 16))])
                    for i in range(400)
                ),
                _clone_from(uuid.UUID(full_uuid)),
            ),
            "alpha-as-parent": _crafted(
                Command.build(
                    "snapshot",
                    [
                        ("path", b"evil2"),
                        ("uuid", uuid.uuid4()),
                        ("ctransid", 9),
                        ("clone_uuid", uuid.UUID(full_uuid)),
                        ("clone_ctransid", 7),
                    ],
                )
            ),
            "leaves-the-place": _crafted(
                Command.build("subvol", [("path", b"../outside"), ("uuid", uuid.uuid4()), ("ctransid", 1)])
            ),
        }
        files = {}
        for name, data in attacks.items():
            files[name] = tmp_path / f"{name}.stream"
            files[name].write_bytes(data)
        with service(config, port) as proc:
            results = [send(port, tmp_path, "alpha", FULL), send(port, tmp_path, "alpha", INCR)]
            refused = {name: send(port, tmp_path, "beta", path) for name, path in files.items()}
            (alpha, ages), (beta, _) = (_arrivals(send(port, tmp_path, c, FULL, "--list").stdout) for c in CLIENTS[:2])
        for stream in (FULL, INCR):
            subprocess.run(
                ["btrfs", "receive", "-f", str(stream), str(mnt / "direct")], capture_output=True, check=True
            )
        assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
        for sub in ("rich_base", "rich_incr"):
            assert differences(mnt / "direct" / sub, mnt / "alpha" / sub) == []
            assert _received_uuid(mnt / "alpha" / sub) == _received_uuid(mnt / "direct" / sub)
        theirs = f"subvolume {full_uuid}, which is not this client's [attribute clone_uuid]"
        why = {
            "clone-from-alpha": f"clone names {theirs}",
            "clone-after-data": f"clone names {theirs}",
            "alpha-as-parent": f"snapshot names {theirs}",
            "leaves-the-place": "subvol names its subvolume b'../outside', not one name in this client's place",
        }
        for name, result in refused.items():
            assert result.returncode == 2 and why[name].encode() in result.stderr, (name, result.stderr)
        assert os.listdir(mnt / "beta") == []  # nothing of any of them is left
        assert not (mnt / "outside").exists()
        full, incr = f"{full_uuid}.7", f"{stream_identity(INCR.read_bytes())['uuid']}.9"
        assert alpha == [f"{full} full rich_base", f"{incr} from {full} rich_incr"]
        assert all(-2 < age < 600 for age in ages), ages  # btrfs's own time of each receive (the rtime)
        assert beta == []
        log = events(proc)
        assert sum(e["event"] == "received" for e in log) == 2
        assert any(e["event"] == "btrfs-receive" and e["line"] == "At subvol evil3" for e in log)  # begun, then gone


def _subvol(name: bytes, subvolume: uuid.UUID | None = None) -> Command:
    return Command.build("subvol", [("path", name), ("uuid", subvolume or uuid.uuid4()), ("ctransid", 3)])


def _mkfile(path: bytes, ino: int = 257) -> Command:
    return Command.build("mkfile", [("path", path), ("ino", ino)])


FULL_UUID = stream_identity(FULL.read_bytes()[:65536])["uuid"]
ODD_NAMES = (  # not UTF-8 (latin-1); a newline (that forges a line of `btrfs subvolume list`) and a terminal's escape
    b"caf\xe9",
    f"two\nID 999 gen 1 top level 5 received_uuid {FULL_UUID} uuid {FULL_UUID} path \x1b[7m".encode(),
)


@pytest.mark.btrfs
def test_into_btrfs_receive_a_name_is_data(tmp_path: Path) -> None:
    """A client's subvolume names that are no UTF-8 text, or hold control characters, stop nobody: another
    client's transfer, the lists, a metrics scrape and the log all go on, the names escaped."""
    need_root_btrfs()
    prom = pytest.importorskip("prometheus_client.parser", reason="the test extra has prometheus_client")
    uuids = [uuid.uuid4() for _ in ODD_NAMES]
    with btrfs_loop("512M") as mnt:
        port, scrape = free_port(), free_port()
        config = _receive_config(tmp_path, mnt, port, ("alpha", "beta"))
        with service(config, port, "--metrics", f"127.0.0.1:{scrape}", "--log-format", "text") as proc:
            wait_listening(scrape)
            odd = []
            for name, subvolume in zip(ODD_NAMES, uuids, strict=True):
                (tmp_path / "odd.stream").write_bytes(_crafted(_subvol(name, subvolume), _mkfile(b"f")))
                odd.append(send(port, tmp_path, "beta", tmp_path / "odd.stream"))
            other = send(port, tmp_path, "alpha", FULL)
            listed = send(port, tmp_path, "beta", FULL, "--list")
            as_json = send(port, tmp_path, "beta", FULL, "--list", "--json")
            alpha = send(port, tmp_path, "alpha", FULL, "--list")
            scraped = urllib.request.urlopen(f"http://127.0.0.1:{scrape}/metrics", timeout=10).read().decode()
        log = proc.stderr.read() if proc.stderr else b""
        assert [r.returncode for r in odd] == [0, 0], [r.stderr for r in odd]
        assert other.returncode == 0, other.stderr
        assert sorted(os.listdir(os.fsencode(mnt / "beta"))) == sorted(ODD_NAMES)
    shown = ["caf\\xe9", ODD_NAMES[1].decode().replace("\n", "\\n").replace("\x1b", "\\x1b")]
    assert _arrivals(listed.stdout)[0] == [f"{u}.3 full {n}" for u, n in zip(uuids, shown, strict=True)]
    snapshots = [json.loads(line) for line in as_json.stdout.decode().splitlines()]
    assert [(s["name"], s.get("name_base64")) for s in snapshots] == [
        (shown[0], base64.b64encode(ODD_NAMES[0]).decode()),  # not UTF-8: its bytes in base64 beside
        (ODD_NAMES[1].decode(), None),  # UTF-8: the name itself, its control characters escaped by JSON
    ]
    assert _arrivals(alpha.stdout)[0][0].endswith(" rich_base"), alpha.stderr
    series = {
        s.labels["subvolume"]
        for family in prom.text_string_to_metric_families(scraped)
        for s in family.samples
        if "subvolume" in s.labels
    }
    assert series == {*shown, "rich_base"}
    text = log.decode()  # UTF-8, every line of it
    assert all(line.isprintable() for line in text.splitlines()), text
    received = [line.split(" subvolumes=")[1] for line in text.splitlines() if " received " in line]
    assert [r.split(" bytes=")[0] for r in received] == [shown[0], json.dumps(shown[1]), "rich_base"], text


def _escapes(mine: uuid.UUID) -> dict[str, list[Command]]:
    """Commands whose paths leave their subvolume (``mine``), each by another attribute."""
    build = Command.build
    clone = [("path", b"f"), ("file_offset", 0), ("clone_len", 4096), ("clone_uuid", mine), ("clone_ctransid", 3)]
    data = [build("write", [("path", b"f"), ("file_offset", i << 16), ("data", bytes(1 << 16))]) for i in range(400)]
    return {
        "path": [build("mkdir", [("path", b"../escaped"), ("ino", 258)])],
        "path, deeper": [build("mkdir", [("path", b"d"), ("ino", 258)]), _mkfile(b"d/../../escaped", 259)],
        "path, absolute": [build("mkdir", [("path", b"/escaped"), ("ino", 258)])],
        "path, NUL": [build("mkdir", [("path", b"escaped\0/../x"), ("ino", 258)])],
        "path_to": [build("rename", [("path", b"f"), ("path_to", b"../escaped")])],
        "path_link": [build("link", [("path", b"g"), ("path_link", b"../escaped")])],
        "clone_path": [Command.build("clone", [*clone, ("clone_path", b"../escaped"), ("clone_offset", 0)])],
        "path, after 25 MiB": [*data, build("mkdir", [("path", b"../escaped"), ("ino", 258)])],
    }


@pytest.mark.btrfs
def test_into_btrfs_receive_no_path_leaves_its_subvolume(tmp_path: Path) -> None:
    """``..``, an absolute path or a NUL in any path of a stream is refused before btrfs receive sees it,
    and what the refused transfer began is gone; a symlink's target may say anything."""
    need_root_btrfs()
    mine = uuid.uuid4()
    with btrfs_loop("512M") as mnt:
        port = free_port()
        config = _receive_config(tmp_path, mnt, port, ("beta",))
        with service(config, port) as proc:
            refused = {}
            for attribute, commands in _escapes(mine).items():
                stream = tmp_path / "escape.stream"
                stream.write_bytes(_crafted(_subvol(b"evil", mine), _mkfile(b"f"), *commands))
                refused[attribute] = send(port, tmp_path, "beta", stream)
            link = Command.build("symlink", [("path", b"s"), ("ino", 258), ("path_link", b"../../escaped")])
            stream.write_bytes(_crafted(_subvol(b"fine"), _mkfile(b"f"), link))
            fine = send(port, tmp_path, "beta", stream)
        for attribute, result in refused.items():
            why = re.compile(rf"names a path out of its subvolume: .* \[attribute {attribute.split(',')[0]}\]".encode())
            assert result.returncode == 2 and why.search(result.stderr), (attribute, result.stderr)
        assert fine.returncode == 0, fine.stderr
        assert os.readlink(mnt / "beta" / "fine" / "s") == "../../escaped"
        assert sorted(os.listdir(mnt)) == ["beta"] and os.listdir(mnt / "beta") == ["fine"]
        assert any(e["event"] == "btrfs-receive" and e["line"] == "At subvol evil" for e in events(proc))  # begun


def _symlink_snapshots(tmp_path: Path) -> tuple[Path, Path]:
    """A real ``btrfs send`` of a tree whose symlinks lead out of it (``..``, ``../..``, ``/``, absolute
    targets), and of its child in which directories holding them are renamed and symlinks moved."""
    streams = tmp_path / "links-full.stream", tmp_path / "links-incr.stream"
    with btrfs_loop("256M") as src:
        vol = src / "vol"
        subprocess.run(["btrfs", "-q", "subvolume", "create", str(vol)], check=True)
        (vol / "d" / "e").mkdir(parents=True)
        (vol / "d" / "f").write_bytes(os.urandom(100_000))
        (vol / "d" / "e" / "g").write_bytes(b"g")
        for name, target in (("up", ".."), ("root", "/"), ("abs", "/etc/passwd"), ("other", "../other-subvolume")):
            (vol / name).symlink_to(target)
        (vol / "d" / "back").symlink_to("../..")
        (vol / "to-d").symlink_to("d")
        subprocess.run(["btrfs", "-q", "subvolume", "snapshot", "-r", str(vol), str(src / "one")], check=True)
        (vol / "d").rename(vol / "D")
        (vol / "up").rename(vol / "D" / "up")
        (vol / "D" / "e" / "new").symlink_to("../../..")
        (vol / "abs").rename(vol / "abs2")
        (vol / "root").unlink()
        (vol / "root").mkdir()
        (vol / "D" / "f").rename(vol / "root" / "f")
        (vol / "D" / "e" / "g").write_bytes(b"changed")
        subprocess.run(["btrfs", "-q", "subvolume", "snapshot", "-r", str(vol), str(src / "two")], check=True)
        subprocess.run(["btrfs", "send", "-q", "-f", str(streams[0]), str(src / "one")], check=True)
        subprocess.run(
            ["btrfs", "send", "-q", "-p", str(src / "one"), "-f", str(streams[1]), str(src / "two")], check=True
        )
    return streams


@pytest.mark.btrfs
def test_into_btrfs_receive_symlinks_out_of_the_tree_are_received_as_they_are(tmp_path: Path) -> None:
    """Symlinks to ``..``, ``/`` and absolute paths are backups' everyday content: a real full and incremental
    ``btrfs send`` of them (directories that hold them renamed, symlinks moved), in two transfers and in
    one, and the fixtures' absolute and dangling symlinks, are received as a direct ``btrfs receive`` has them."""
    need_root_btrfs()
    full, incr = _symlink_snapshots(tmp_path)
    both = tmp_path / "both.stream"
    both.write_bytes(full.read_bytes() + incr.read_bytes())
    with btrfs_loop("512M") as mnt:
        (mnt / "direct").mkdir()
        port = free_port()
        config = _receive_config(tmp_path, mnt, port, ("alpha",))
        with service(config, port):
            apart = [send(port, tmp_path, "alpha", stream) for stream in (full, incr, FULL)]
            assert [r.returncode for r in apart] == [0, 0, 0], [r.stderr for r in apart]
            received = {sub: tree_state(mnt / "alpha" / sub) for sub in ("one", "two", "rich_base")}
            for sub in ("one", "two"):
                subprocess.run(["btrfs", "-q", "subvolume", "delete", str(mnt / "alpha" / sub)], check=True)
            together = send(port, tmp_path, "alpha", both)  # the child's parent is the input's first subvolume
        assert together.returncode == 0, together.stderr
        for stream in (full, incr, FULL):  # (after: the service takes no UUID that a subvolume outside has)
            subprocess.run(
                ["btrfs", "receive", "-f", str(stream), str(mnt / "direct")], capture_output=True, check=True
            )
        assert received == {sub: tree_state(mnt / "direct" / sub) for sub in received}
        for sub in ("one", "two"):
            assert differences(mnt / "direct" / sub, mnt / "alpha" / sub) == []
        assert os.readlink(mnt / "alpha" / "two" / "D" / "up") == ".."
        assert os.readlink(mnt / "alpha" / "rich_base" / "link-absolute") == "/etc/passwd"


EVIL = uuid.uuid4()


def _through(*commands: Command) -> list[Command]:
    """``commands`` after a subvolume (``EVIL``) with a symlink ``l -> ..`` and a file ``f``."""
    symlink = Command.build("symlink", [("path", b"l"), ("ino", 257), ("path_link", b"..")])
    return [_subvol(b"evil", EVIL), symlink, _mkfile(b"f", 258), *commands]


def _snapshot_of(parent: uuid.UUID, *commands: Command, name: bytes = b"evil") -> list[Command]:
    snapshot = [("path", name), ("uuid", uuid.uuid4()), ("ctransid", 9), ("clone_uuid", parent)]
    return [Command.build("snapshot", [*snapshot, ("clone_ctransid", 7)]), *commands]


def _escapes_through_symlinks(parent: uuid.UUID, device: int) -> dict[str, tuple[list[Command], str]]:
    """Streams whose last command reaches out through a symlink (or into a device): the commands, and the
    attribute at fault."""
    build = Command.build
    at = [("file_offset", 0)]
    clone = [*at, ("clone_len", 4096), ("clone_uuid", EVIL), ("clone_ctransid", 3), ("clone_offset", 0)]
    up = [
        build("symlink", [("path", b"o300-1-0"), ("ino", 300), ("path_link", b"..")]),
        build("mkdir", [("path", b"o301-1-0"), ("ino", 301)]),
        build("rename", [("path", b"o300-1-0"), ("path_to", b"o301-1-0/up")]),
        build("rename", [("path", b"o301-1-0"), ("path_to", b"d")]),
    ]
    return {
        "mkdir": (_through(build("mkdir", [("path", b"l/escaped"), ("ino", 259)])), "path"),
        "mkfile": (_through(_mkfile(b"l/escaped", 259)), "path"),
        "symlink": (_through(build("symlink", [("path", b"l/s"), ("ino", 259), ("path_link", b"x")])), "path"),
        "write": (_through(build("write", [("path", b"l/escaped"), *at, ("data", b"x")])), "path"),
        "rename": (_through(build("rename", [("path", b"f"), ("path_to", b"l/escaped")])), "path_to"),
        "link": (_through(build("link", [("path", b"l/escaped"), ("path_link", b"f")])), "path"),
        "link of": (_through(build("link", [("path", b"g"), ("path_link", b"l/p/serve.toml")])), "path_link"),
        "unlink": (_through(build("unlink", [("path", b"l/.journal")])), "path"),
        "chown": (_through(build("chown", [("path", b"l/x"), ("uid", 0), ("gid", 0)])), "path"),
        "set_xattr": (
            _through(build("set_xattr", [("path", b"l/x"), ("xattr_name", b"user.x"), ("xattr_data", b"")])),
            "path",
        ),
        "truncate": (_through(build("truncate", [("path", b"l/x"), ("size", 0)])), "path"),
        "clone": (_through(build("clone", [("path", b"f"), *clone, ("clone_path", b"l/x")])), "clone_path"),
        "chmod of the symlink": (_through(build("chmod", [("path", b"l"), ("mode", 0o777)])), "path"),
        "mkfile on a symlink": (
            [
                _subvol(b"evil"),
                build("symlink", [("path", b"m"), ("ino", 257), ("path_link", b"../made")]),
                _mkfile(b"m", 258),
            ],
            "path",
        ),
        "renamed twice": (
            [
                _subvol(b"evil"),
                *up,
                build("rename", [("path", b"d"), ("path_to", b"e")]),
                build("mkdir", [("path", b"e/up/x"), ("ino", 302)]),
            ],
            "path",
        ),
        "renamed onto its hard link": (
            _through(
                build("link", [("path", b"b"), ("path_link", b"l")]),
                build("rename", [("path", b"l"), ("path_to", b"b")]),
                build("mkdir", [("path", b"l/escaped"), ("ino", 259)]),
            ),
            "path",
        ),
        "a device": (
            [
                _subvol(b"evil"),
                build("mknod", [("path", b"disk"), ("ino", 257), ("mode", stat.S_IFBLK | 0o600), ("rdev", device)]),
                build("write", [("path", b"disk"), *at, ("data", b"x" * 4096)]),
            ],
            "path",
        ),
        "the subvolume itself": ([_subvol(b"evil"), build("rmdir", [("path", b"")])], "path"),
        "the parent's": (_snapshot_of(parent, build("mkdir", [("path", b"up/escaped"), ("ino", 259)])), "path"),
        "the parent's, renamed": (
            _snapshot_of(
                parent,
                build("rename", [("path", b"d"), ("path_to", b"o259-9-0")]),
                build("mkdir", [("path", b"o259-9-0/back/escaped"), ("ino", 260)]),
            ),
            "path",
        ),
        "the parent's, chmod": (_snapshot_of(parent, build("chmod", [("path", b"up"), ("mode", 0o777)])), "path"),
        "the input's first stream's": (
            [
                *_through(),
                build("end"),
                *_snapshot_of(EVIL, build("mkdir", [("path", b"l/x"), ("ino", 259)]), name=b"e2"),
            ],
            "path",
        ),
    }


def _chained(*commands: Command) -> bytes:
    """A version-2 input of ``commands`` and END, a stream header after each END in them."""
    end = encode_command(Command.build("end"), 2)
    return (
        encode_stream_header(2)
        + b"".join(encode_command(c, 2) + (encode_stream_header(2) if c.name == "end" else b"") for c in commands)
        + end
    )


@pytest.mark.btrfs
def test_into_btrfs_receive_no_path_goes_through_a_symlink(tmp_path: Path) -> None:
    """A path through a symlink of the subvolume (made by the stream, or the parent's), or to one that btrfs
    receive would follow or open, is refused before btrfs receive sees it: nothing is made, changed or
    removed in the place, and a device node is never written."""
    need_root_btrfs()
    full, _ = _symlink_snapshots(tmp_path)
    parent = uuid.UUID(stream_identity(full.read_bytes())["uuid"])
    victim = tmp_path / "victim.img"
    victim.write_bytes(bytes(1 << 20))
    loop = subprocess.run(["losetup", "-f", "--show", str(victim)], capture_output=True, text=True, check=True)
    try:
        device = os.stat(loop.stdout.strip()).st_rdev
        with btrfs_loop("512M") as mnt:
            port = free_port()
            config = _receive_config(tmp_path, mnt, port, ("beta",))
            place = mnt / "beta"
            os.chmod(place, 0o750)
            with service(config, port):
                base = send(port, tmp_path, "beta", full)
                assert base.returncode == 0, base.stderr
                refused = {}
                for name, (commands, attribute) in _escapes_through_symlinks(parent, device).items():
                    (tmp_path / "escape.stream").write_bytes(_chained(*commands))
                    offset = len(_chained(*commands[:-1])) - len(encode_command(Command.build("end"), 2))
                    result = send(port, tmp_path, "beta", tmp_path / "escape.stream")
                    refused[name] = (result, offset, commands[-1].name, attribute)
            assert sorted(os.listdir(mnt)) == ["beta"] and sorted(os.listdir(place)) == ["one"]
            assert stat.S_IMODE(os.stat(place).st_mode) == 0o750
        for name, (result, offset, command, attribute) in refused.items():
            why = rf"offset {offset}, command #\d+ \({command}\): refused: {command} names a path out of its subvolume"
            assert result.returncode == 2, (name, result.stderr)
            assert re.search(rf"{why}: .*\[attribute {attribute}\]".encode(), result.stderr), (name, result.stderr)
    finally:
        subprocess.run(["losetup", "-d", loop.stdout.strip()], check=True)
    assert victim.read_bytes() == bytes(1 << 20)


def _logged(proc: subprocess.Popen[bytes], kept: list[dict[str, object]], wanted: dict[str, object]) -> None:
    """Read the service's log (into ``kept``) until an event with the fields ``wanted``."""
    assert proc.stderr is not None
    failsafe = threading.Timer(60, proc.kill)  # then the log ends, and so does the wait
    failsafe.start()
    try:
        while not kept or any(kept[-1].get(k) != v for k, v in wanted.items()):
            line = proc.stderr.readline()
            assert line, f"the service ended before {wanted}: {kept}"
            kept.append(json.loads(line))
    finally:
        failsafe.cancel()


@pytest.mark.btrfs
def test_into_btrfs_receive_a_uuid_received_meanwhile_is_not_claimed(tmp_path: Path) -> None:
    """A transfer held open while the same UUID is received elsewhere on the file system cannot claim it
    after all; the refusal says where the other subvolume is."""
    need_root_btrfs()
    full_uuid = uuid.UUID(FULL_UUID)
    head = _crafted(_subvol(b"first"), _mkfile(b"f"))[: -len(encode_command(Command.build("end"), 2))]
    rest = encode_command(Command.build("end"), 2) + _crafted(_subvol(b"copy", full_uuid))
    with btrfs_loop("512M") as mnt:
        (mnt / "direct").mkdir()
        port = free_port()
        config = _receive_config(tmp_path, mnt, port, ("alpha",))
        with service(config, port) as proc:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.settimeout(60)
            with connect_channel(
                sock, "tls13-aes128-gcm", load_key(tmp_path / "keys" / "alpha.key"), "alpha"
            ) as channel:
                channel.send_all(head)
                log: list[dict[str, object]] = []
                _logged(proc, log, {"event": "btrfs-receive", "line": "At subvol first"})  # the guard is past its start
                subprocess.run(
                    ["btrfs", "receive", "-f", str(FULL), str(mnt / "direct")], capture_output=True, check=True
                )
                channel.send_all(rest)
                channel.shutdown_write()
                buf = bytearray(4096)
                told = bytes(buf[: channel.recv_into(buf)])
        assert told.startswith(b"sendstream-status 2 "), told
        where = "which the subvolume <FS_TREE>/direct/rich_base outside this client's place has too"
        assert f"subvol names subvolume {full_uuid}, {where}" in told.decode(), told
        assert os.listdir(mnt / "alpha") == []  # the first subvolume of the refused transfer too


def test_the_event_log_escapes_what_it_is_given() -> None:
    """Names that are no UTF-8 (as Python reads them: surrogates) and control characters leave the log as
    printable text: plain, or JSON that any parser takes."""
    name = os.fsdecode(b"caf\xe9\n\x1b[7m")
    lines = {}
    for fmt in ("text", "json"):
        out = io.StringIO()
        EventLog(out, fmt)("received", client="beta", subvolumes=name, line="At subvol " + name)
        lines[fmt] = out.getvalue()
    assert lines["text"].endswith(
        ' received client=beta subvolumes=caf\\xe9\\n\\x1b[7m line="At subvol caf\\\\xe9\\\\n\\\\x1b[7m"\n'
    ), lines["text"]
    assert lines["text"][:-1].isprintable()
    logged = json.loads(lines["json"])
    assert logged["subvolumes"] == "caf\\xe9\\n\\x1b[7m" and logged["line"] == "At subvol " + logged["subvolumes"]


def test_a_plain_receiver_has_no_list_to_give(tmp_path: Path) -> None:
    port = free_port()
    key = key_file(tmp_path / "k")
    recv = subprocess.Popen(
        [*CMD, "receive", "--listen", f"127.0.0.1:{port}", "-o", str(tmp_path / "out"), "--key", str(key)],
        stderr=subprocess.PIPE,
    )
    try:
        wait_listening(port)
        argv = [*CMD, "send", "--to", f"127.0.0.1:{port}", "--key", str(key), "--list"]
        listed = subprocess.run(argv, capture_output=True)
    finally:
        recv.kill()
        recv.wait()
    assert listed.returncode == 2, listed.stderr
    assert listed.stderr.decode().strip() == (
        "sendstream: error: the receiver refused: this receiver keeps no snapshots to list: "
        "--list asks a sendstream serve"
    )


def _arrivals(output: bytes) -> tuple[list[str], list[float]]:
    """``send --list``'s lines without their ``arrived TIME`` and how many seconds ago each TIME is."""
    lines, ages = [], []
    for line in output.decode().splitlines():
        said, _, when = line.rpartition(" arrived ")
        lines.append(said)
        ages.append(time.time() - datetime.datetime.fromisoformat(when).timestamp())
    return lines, ages


@contextlib.contextmanager
def _held(port: int, key: Path, data: bytes) -> Iterator[Callable[[], bytes]]:
    """A transfer of ``data`` (a raw stream through a TLS channel of ``key``'s client ``alpha``) whose first
    64 KiB are sent and the rest held back: a running transfer until the call given sends the rest (and
    returns the status line), or the service cuts it."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(60)
    with connect_channel(sock, "tls13-aes128-gcm", load_key(key), "alpha") as channel:
        channel.send_all(data[: 64 << 10])

        def rest() -> bytes:
            channel.send_all(data[64 << 10 :])
            channel.shutdown_write()
            buf = bytearray(4096)
            return bytes(buf[: channel.recv_into(buf)])

        yield rest


def _until_nothing_listens(port: int) -> None:
    """Until the service has closed its listening socket (as SIGTERM and Ctrl-C make it)."""
    deadline = time.monotonic() + 60
    while listening(port):
        assert time.monotonic() < deadline, f"port {port} still listens after 60 s"
        time.sleep(0.02)


def _scraped(scrape: int, until: Callable[[dict[str, float]], bool]) -> dict[str, float]:
    """The samples of the first scrape of which ``until`` holds."""
    deadline = time.monotonic() + 60
    while not until(samples := _samples(_scrape(scrape))):
        assert time.monotonic() < deadline, samples
    return samples


def _scrape(scrape: int) -> str:
    return str(urllib.request.urlopen(f"http://127.0.0.1:{scrape}/metrics", timeout=10).read().decode())


ACTIVE = 'sendstream_active_transfers{client="alpha"}'


def test_metrics_are_scraped_over_http(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client", reason="serve --metrics needs prometheus_client (the test extra has it)")
    port, scrape = free_port(), free_port()
    config = write_config(tmp_path, port, "max_per_client = 1", clients=("alpha",))
    big = tmp_path / "big.stream"  # not FULL's name again: another stream of a stored name is refused
    big.write_bytes((FIXTURES / "compressed-v2.stream").read_bytes() * 20)
    with service(config, port, "--metrics", f"127.0.0.1:{scrape}") as proc:
        wait_listening(scrape)
        with _held(port, tmp_path / "keys" / "alpha.key", big.read_bytes()) as rest:
            _logged(proc, [], {"event": "transfer"})  # it runs
            during = _samples(_scrape(scrape))
            assert send(port, tmp_path, "alpha", FULL).returncode == 4  # busy
            told = rest()
        assert send(port, tmp_path, "alpha", FULL).returncode == 0
        assert send(port, tmp_path, "alpha", INCR).returncode == 0
        damaged = bytearray(FULL.read_bytes())
        damaged[len(damaged) // 2] ^= 0xFF
        raw_tls_send(port, tmp_path / "keys" / "alpha.key", "alpha", bytes(damaged))
        samples = _scraped(scrape, lambda samples: samples[ACTIVE] == 0)  # (counted after the sender is told)
    assert told.startswith(b"sendstream-status 0 "), told
    assert during[ACTIVE] == 1
    size = FULL.stat().st_size + INCR.stat().st_size + big.stat().st_size
    assert {k: v for k, v in samples.items() if "last_success" not in k} == {
        'sendstream_transfers_total{client="alpha",result="ok"}': 3,
        'sendstream_transfers_total{client="alpha",result="failed"}': 1,
        'sendstream_transfers_total{client="alpha",result="busy"}': 1,
        'sendstream_received_bytes_total{client="alpha"}': size,
        ACTIVE: 0,
    }
    last = {k: v for k, v in samples.items() if "last_success" in k}
    assert sorted(last) == [
        f'sendstream_last_success_timestamp_seconds{{client="alpha",subvolume="{name}"}}'
        for name in ("comp_snap", "rich_base", "rich_incr")
    ]
    assert all(abs(v - time.time()) < 120 for v in last.values()), last
    assert proc.returncode == 0


def _samples(text: str) -> dict[str, float]:
    """The samples of a scrape: ``name{labels}`` -> value (the _created series left out)."""
    rows = (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in rows if "_created" not in name}


def test_sigterm_lets_a_running_transfer_end_and_takes_no_new_one(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    big = tmp_path / "big.stream"
    big.write_bytes(FULL.read_bytes() * 6)
    log: list[dict[str, object]] = []
    with service(config, port) as proc:
        with _held(port, tmp_path / "keys" / "alpha.key", big.read_bytes()) as rest:
            _logged(proc, log, {"event": "transfer"})  # it runs
            proc.send_signal(signal.SIGTERM)
            _until_nothing_listens(port)
            late = send(port, tmp_path, "alpha", FULL, "--retries", "0")
            told = rest()
        proc.wait(60)
    assert told.startswith(b"sendstream-status 0 "), told  # the running transfer ended well
    assert late.returncode == 4 and b"connection refused" in late.stderr, late.stderr
    assert proc.returncode == 0
    log += events(proc)
    assert [e["event"] for e in log][-2:] == ["stored", "stopped"]
    assert stored(tmp_path, "alpha")[name_of(big)] == big.read_bytes()


def test_a_second_ctrl_c_ends_a_draining_service_at_once(tmp_path: Path) -> None:
    """The first Ctrl-C drains (running transfers may end); the second one stops the service there, its
    running transfer cut (not after the drain, which would end with 0 and "stopped")."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    big = tmp_path / "big.stream"
    big.write_bytes(FULL.read_bytes() * 20)
    with service(config, port) as proc, _held(port, tmp_path / "keys" / "alpha.key", big.read_bytes()):
        _logged(proc, [], {"event": "transfer"})  # it runs, and never ends on its own: the rest is held
        proc.send_signal(signal.SIGINT)
        _until_nothing_listens(port)
        assert proc.poll() is None, "the first Ctrl-C lets the running transfer go on"
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert proc.returncode == 130
    assert proc.stderr is not None
    assert proc.stderr.read().endswith(b"sendstream: interrupted\n")
    assert not (tmp_path / "places" / "alpha" / name_of(big)).exists()


# resume without tokens: the service journals a session's stream and tells a sender that comes back where


def _sender(port: int, tmp_path: Path, stream: Path, *extra: str) -> subprocess.Popen[bytes]:
    return _sender_of(port, tmp_path, "alpha", stream, "--resumable", *extra)


def _big(tmp_path: Path) -> Path:
    """11 MB of real streams: 5.5 s at 2 MiB/s."""
    big = tmp_path / "big.stream"
    big.write_bytes(FULL.read_bytes() * 40)
    return big


def _until_journaled(place: Path) -> None:
    """Until the service's journal of the transfer into ``place`` holds 3 MiB, and a checkpoint (every
    second) is durable."""
    part = place
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        parts = list(part.glob(".*.incoming.part"))
        if parts and parts[0].stat().st_size >= 3 << 20:
            break
        time.sleep(0.1)
    time.sleep(1.5)


def _fresh_checkpoint(place: Path, key: Path) -> int:
    """The offset of the journal's checkpoint once the cut transfer made everything it got durable: the
    whole part (checkpoints otherwise come every second); a failure after 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        part = next(place.glob(".*.incoming.part"))
        state = load_state(str(part)[: -len(PART_SUFFIX)], load_key(key))
        if state.offset == part.stat().st_size:
            return state.offset
        time.sleep(0.1)
    raise AssertionError(f"the checkpoint stays at {state.offset} of the part's {part.stat().st_size} bytes")


def test_a_sender_killed_mid_transfer_resumes_without_a_token(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    big = _big(tmp_path)
    with service(config, port) as proc:
        first = _sender(port, tmp_path, big, "--rate-limit", "2M")
        _until_journaled(tmp_path / "places" / "alpha")
        first.kill()
        first.wait()
        kept = _fresh_checkpoint(tmp_path / "places" / "alpha", tmp_path / "keys" / "alpha.key")
        other = tmp_path / "other.stream"  # its first 64 KiB are big's, so it says it is the same stream
        other.write_bytes(FULL.read_bytes() * 5 + INCR.read_bytes() + FULL.read_bytes() * 35)
        _, differs = _sender(port, tmp_path, other).communicate(timeout=60)
        again = _sender(port, tmp_path, big)
        _, err = again.communicate(timeout=60)
    assert b"another stream: the stream differs from what the receiver kept" in differs, differs
    assert again.returncode == 0, err
    resumed = int(re.search(rb"resumed at offset (\d+)", err).group(1))  # type: ignore[union-attr]
    assert resumed == kept and 2 << 20 < resumed < big.stat().st_size, err
    held = stored(tmp_path, "alpha")
    assert sorted(held) == [name_of(big), name_of(big) + ".json"] and held[name_of(big)] == big.read_bytes()
    note = json.loads(held[name_of(big) + ".json"])
    assert note["sha256"] == hashlib.sha256(big.read_bytes()).hexdigest() and note["size"] == big.stat().st_size
    log = events(proc)
    assert [e.get("resumed") for e in log if e["event"] == "transfer"] == [None, resumed, resumed]


def test_a_killed_service_started_again_takes_its_senders_back(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    big = _big(tmp_path)
    with service(config, port) as proc:
        sender = _sender(port, tmp_path, big, "--rate-limit", "2M", "--retries", "20", "--retry-delay", "0.5", "-v")
        _until_journaled(tmp_path / "places" / "alpha")
        proc.kill()  # SIGKILL: no time to say anything
        proc.wait()
    with service(config, port) as proc:
        _, err = sender.communicate(timeout=60)
    assert sender.returncode == 0, err
    assert b"resumed after 1 drop" in err, err
    assert stored(tmp_path, "alpha")[name_of(big)] == big.read_bytes()
    log = events(proc)
    transfer = next(e for e in log if e["event"] == "transfer")
    resumed = int(transfer["resumed"])  # type: ignore[call-overload]
    assert 2 << 20 < resumed < big.stat().st_size
    # the stream's offset where it resumed, and what was sent twice: no "of" a count that is not the stream's size
    again = re.search(rb"receiver verified ([0-9,]+) bytes; resuming at offset (\d+) \(([0-9,]+) resent\)", err)
    assert again is not None and int(again.group(2)) == resumed, err
    assert next(e for e in log if e["event"] == "stored")["bytes"] == big.stat().st_size


def test_a_plain_sender_whose_service_is_killed_fails_naming_it(tmp_path: Path) -> None:
    """The soak's finding: a plain (not resumable) sender whose service was SIGKILLed mid-stream exited 0
    with no word, as if stored (its next write broke the pipe, taken for standard output's reader
    leaving). It fails naming the receiver, and nothing is stored."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    big = _big(tmp_path)
    place = tmp_path / "places" / "alpha"
    with service(config, port) as proc:
        sender = _sender_of(port, tmp_path, "alpha", big, "--rate-limit", "2M")
        deadline = time.monotonic() + 20
        while not any(p.stat().st_size >= 1 << 20 for p in place.glob(".*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.05)  # the raw stream's hidden file holds 1 MiB: the transfer is under way
        proc.kill()
        proc.wait()
        _, err = sender.communicate(timeout=60)
    said = f"sendstream: error: sending to 127.0.0.1:{port}: the receiver went away before the whole stream was sent ("
    assert sender.returncode == 4 and said.encode() in err, err
    with service(config, port):
        pass  # started again, it removes what the killed one left
    assert list(place.iterdir()) == []


@pytest.mark.btrfs
def test_a_killed_service_resumes_into_btrfs_receive(tmp_path: Path) -> None:
    """The subvolume the killed run began is deleted, the kept part given to btrfs receive again, and the
    sender goes on from its checkpoint: the snapshot is the one a direct transfer gives, and its child too."""
    need_root_btrfs()
    streams = tmp_path / "full.stream", tmp_path / "incr.stream"
    with btrfs_loop("256M") as src:
        subprocess.run(["btrfs", "-q", "subvolume", "create", str(src / "vol")], check=True)
        for i in range(6):
            (src / "vol" / f"f{i}").write_bytes(os.urandom(2 << 20))
        subprocess.run(["btrfs", "-q", "subvolume", "snapshot", "-r", str(src / "vol"), str(src / "one")], check=True)
        (src / "vol" / "f0").write_bytes(b"changed")
        subprocess.run(["btrfs", "-q", "subvolume", "snapshot", "-r", str(src / "vol"), str(src / "two")], check=True)
        subprocess.run(["btrfs", "send", "-q", "-f", str(streams[0]), str(src / "one")], check=True)
        subprocess.run(
            ["btrfs", "send", "-q", "-p", str(src / "one"), "-f", str(streams[1]), str(src / "two")], check=True
        )
    with btrfs_loop("512M") as mnt:
        (mnt / "direct").mkdir()
        port = free_port()
        config = _receive_config(tmp_path, mnt, port, ("alpha",))
        with service(config, port) as proc:
            sender = _sender(
                port, tmp_path, streams[0], "--rate-limit", "2M", "--retries", "20", "--retry-delay", "0.5"
            )
            _until_journaled(mnt / "alpha")
            proc.kill()
            proc.wait()
        assert _received_uuid(mnt / "alpha" / "one") == "-"  # the killed run's, unfinished
        with service(config, port) as proc:
            _, err = sender.communicate(timeout=60)
            child = send(port, tmp_path, "alpha", streams[1])
        for stream in streams:
            subprocess.run(
                ["btrfs", "receive", "-f", str(stream), str(mnt / "direct")], capture_output=True, check=True
            )
        assert sender.returncode == 0 and b"resumed after 1 drop" in err, err
        assert child.returncode == 0, child.stderr
        for sub in ("one", "two"):
            assert differences(mnt / "direct" / sub, mnt / "alpha" / sub) == []
            assert _received_uuid(mnt / "alpha" / sub) == _received_uuid(mnt / "direct" / sub) != "-"
        assert sorted(os.listdir(mnt / "alpha")) == ["one", "two"]  # no journal left
        log = events(proc)
        transfer = next(e for e in log if e["event"] == "transfer")
        assert 2 << 20 < int(transfer["resumed"]) < streams[0].stat().st_size  # type: ignore[call-overload]
        # the stream's size, as the stored streams' count and the sender's say it: not this run's part of it
        received = [e for e in log if e["event"] == "received"]
        assert [e["bytes"] for e in received] == [s.stat().st_size for s in streams], received
        # what btrfs receive says of the incremental on its standard output is the log's too
        assert {"event": "btrfs-receive", "line": "At snapshot two"}.items() <= next(
            e for e in log if str(e.get("line", "")).startswith("At snapshot")
        ).items(), [e for e in log if e["event"] == "btrfs-receive"]
        assert received[0]["resumed"] == transfer["resumed"], received


# journals of abandoned transfers: expired, listed, removed, bounded by a quota (issue 24, finding 23)


def _abandon(port: int, tmp_path: Path, stream: Path) -> str:
    """A resumable send of ``stream`` whose input ends inside a command: the service keeps its journal, with a
    checkpoint at the last command that came. The journal's stream name."""
    cut = tmp_path / "cut.stream"
    data = stream.read_bytes()
    cut.write_bytes(data[: len(data) // 2 + 7])
    result = send(port, tmp_path, "alpha", cut, "--resumable")
    assert result.returncode == 3, result.stderr
    return name_of(stream)


def _journal_files(place: Path) -> list[str]:
    return sorted(p.name for p in place.iterdir() if ".incoming" in p.name)


def test_a_quota_refuses_a_full_place_and_cuts_a_stream_that_would_pass_it(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    config.write_text(config.read_text() + 'quota = "1M"\n')
    place = tmp_path / "places" / "alpha"
    big = tmp_path / "big.stream"
    big.write_bytes(FULL.read_bytes() * 8)  # 2.2 MB
    with service(config, port) as proc:
        first = send(port, tmp_path, "alpha", FULL, "--resumable")
        cut = send(port, tmp_path, "alpha", big, "--resumable")
        (place / "admin's file").write_bytes(bytes(1 << 20))
        refused = send(port, tmp_path, "alpha", INCR, "--resumable")
    assert first.returncode == 0, first.stderr
    assert cut.returncode == 8, cut.stderr
    assert b"limit reached: alpha: the stream would pass its place's quota after " in cut.stderr, cut.stderr
    assert b"(the limit is 1048576; clients.alpha.quota in serve.toml raises it)" in cut.stderr
    assert refused.returncode == 8, refused.stderr
    assert re.search(rb"alpha: its place holds \d+ bytes, its whole quota", refused.stderr), refused.stderr
    assert sorted(stored(tmp_path, "alpha")) == sorted([name_of(FULL), name_of(FULL) + ".json", "admin's file"])
    log = events(proc)
    assert [e["code"] for e in log if e["event"] == "failed"] == [8, 8], log


def test_a_journal_whose_checkpoint_lies_past_its_part_is_discarded(tmp_path: Path) -> None:
    """Its stream's resumable sends failed for ever ("fewer than the N its resume state says"); now the
    journal goes, the service says so, and the stream is stored whole."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    place = tmp_path / "places" / "alpha"
    big = tmp_path / "big.stream"
    big.write_bytes(FULL.read_bytes() * 4)
    with service(config, port) as proc:
        name = _abandon(port, tmp_path, big)
        os.truncate(place / f".{name}.incoming.part", 1000)
        again = send(port, tmp_path, "alpha", big, "--resumable")
    assert again.returncode == 0, again.stderr
    assert stored(tmp_path, "alpha")[name] == big.read_bytes() and not _journal_files(place)
    discarded = [e for e in events(proc) if e["event"] == "discarded"]
    assert len(discarded) == 1 and discarded[0]["journal"] == name, discarded
    assert "lies past the end of its part (1000 bytes)" in str(discarded[0]["reason"])


def test_journals_expire_by_the_services_clock(tmp_path: Path) -> None:
    """journal_days = 2: a sweep at start and every hour of the service's clock (here one the test moves)
    removes the journals not written for two days."""
    from sendstream.service.config import load
    from sendstream.service.server import SWEEP_SECONDS, Service

    port = free_port()
    config = write_config(tmp_path, port, "journal_days = 2", clients=("alpha",))
    place = tmp_path / "places" / "alpha"
    with service(config, port):
        name = _abandon(port, tmp_path, FULL)
    assert len(_journal_files(place)) == 2
    lines: queue.Queue[dict[str, object]] = queue.Queue()

    class Lines:
        def write(self, text: str) -> None:
            lines.put(json.loads(text))

        def flush(self) -> None:
            pass

    now = time.time()
    served = Service(load(str(config)), EventLog(Lines(), "json"), clock=lambda: now)  # type: ignore[arg-type]
    with running(served):
        seen = [lines.get(timeout=30) for _ in range(2)]
        assert [e["event"] for e in seen] == ["client", "listening"]
        now += 2 * 86400 + SWEEP_SECONDS
        expired = lines.get(timeout=30)
    assert expired["event"] == "expired" and expired["journal"] == name and float(str(expired["days"])) >= 2, expired
    assert not _journal_files(place)


def test_expired_journals_are_those_older_than_the_age(tmp_path: Path) -> None:
    from sendstream.service.config import load
    from sendstream.service.journals import expired

    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    with service(config, port):
        name = _abandon(port, tmp_path, FULL)
    client = load(str(config)).clients["alpha"]
    written = max(p.stat().st_mtime for p in (tmp_path / "places" / "alpha").glob(".*.incoming.*"))
    assert expired(client, 86400, written + 86399) == []
    assert [j.name for j in expired(client, 86400, written + 86401)] == [name]


def test_an_admin_lists_and_removes_journals(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha", "beta"))
    place = tmp_path / "places" / "alpha"
    with service(config, port):
        name = _abandon(port, tmp_path, FULL)
    size = sum(p.stat().st_size for p in place.glob(".*.incoming.*"))
    serve = [*CMD, "serve", "--config", str(config)]
    listed = subprocess.run([*serve, "--journals"], capture_output=True, text=True)
    assert listed.returncode == 0 and re.fullmatch(
        rf"alpha {re.escape(name)} {size} bytes, last written \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00\n", listed.stdout
    ), listed
    wrong = subprocess.run([*serve, "--remove-journal", f"beta/{name}"], capture_output=True, text=True)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1, wrong.stderr
    assert f"no journal of {name!r} in beta's place" in wrong.stderr and len(_journal_files(place)) == 2
    removed = subprocess.run([*serve, "--remove-journal", f"alpha/{name}"], capture_output=True, text=True)
    assert removed.returncode == 0 and removed.stdout == f"removed alpha/{name} ({size} bytes)\n", removed
    assert not _journal_files(place)
    assert subprocess.run([*serve, "--journals"], capture_output=True, text=True).stdout == ""


@pytest.mark.btrfs
def test_a_quota_cuts_a_stream_into_btrfs_receive(tmp_path: Path) -> None:
    """Into `btrfs receive` the quota counts the journal as it grows: past it the transfer is cut, and the
    subvolume it began and its journal go."""
    need_root_btrfs()
    with btrfs_loop("256M") as mnt:
        port = free_port()
        config = _receive_config(tmp_path, mnt, port, ("alpha",), 'quota = "100K"')
        with service(config, port):
            cut = send(port, tmp_path, "alpha", FULL, "--resumable")
        assert cut.returncode == 8, cut.stderr
        assert b"alpha: the stream would pass its place's quota" in cut.stderr, cut.stderr
        assert os.listdir(mnt / "alpha") == []


# what a new admin and an attacker found (issue 24)


class LiveLog:
    """The JSON lines a running service logs, read as they come: a test waits for an event, not a time."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._reader.start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            with self._cond:
                self.events.append(json.loads(line) if line.startswith(b"{") else {"event": "text", "line": line})
                self._cond.notify_all()

    def wait(self, match: Callable[[dict[str, Any]], bool], count: int = 1) -> list[dict[str, Any]]:
        """The first ``count`` events that ``match``, once they are logged (a failure after 60 s)."""
        with self._cond:
            found = self._cond.wait_for(lambda: len([e for e in self.events if match(e)]) >= count, timeout=60)
            assert found, self.events
            return [e for e in self.events if match(e)][:count]

    def end(self) -> list[dict[str, Any]]:
        """Every event, once the service ended."""
        self._reader.join(60)
        return self.events


def test_silent_connections_from_one_address_leave_room_for_others(tmp_path: Path) -> None:
    """Connections being opened are bounded per source address: one more from a full one is told the service
    is busy (in TLS, or in plain words), and hundreds of silent ones from one address let another in."""
    port = free_port()
    config = write_config(tmp_path, port, "handshake_timeout = 120", clients=("alpha",))
    with service(config, port):
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_PER_SOURCE)]
        busy = send(port, tmp_path, "alpha", FULL, "--retries", "0")
        with socket.create_connection(("127.0.0.1", port), timeout=20) as plain:
            plain.sendall(b"sendstream-list\n")
            told = plain.recv(4096)
        for sock in held:
            sock.close()
    assert busy.returncode == 4 and b"sendstream: error: the receiver is busy: " in busy.stderr, busy.stderr
    assert b"key" not in busy.stderr and b"TLS handshake failed" not in busy.stderr, busy.stderr
    assert told == b"sendstream-status 4 busy: %d connections from 127.0.0.1 are already opening; try again later\n" % (
        MAX_PER_SOURCE
    )

    with service(config, port) as proc:
        flood = []
        for _ in range(300):
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))
            sock.connect(("127.0.0.1", port))
            flood.append(sock)
        sent = send(port, tmp_path, "alpha", FULL)
        for sock in flood:
            sock.close()
    assert sent.returncode == 0, sent.stderr
    assert stored(tmp_path, "alpha")[name_of(FULL)] == FULL.read_bytes()
    reasons = [str(e.get("reason")) for e in events(proc) if e["event"] == "refused"]
    assert f"busy: {MAX_PER_SOURCE} connections from 127.0.0.2 are already opening" in " ".join(reasons), reasons


def test_a_plain_sender_told_busy_before_it_sent_anything_tries_again(tmp_path: Path) -> None:
    """Nothing of the stream goes before the first connection opens, so a plain (not resumable) send that
    is told busy then tries again as --retries says, and gets in once there is room."""
    port = free_port()
    config = write_config(tmp_path, port, "handshake_timeout = 120", clients=("alpha",))
    with service(config, port) as proc:
        log = LiveLog(proc)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_PER_SOURCE)]
        key = tmp_path / "keys" / "alpha.key"
        argv = [*CMD, "send", "--to", f"127.0.0.1:{port}", str(FULL), "--key", str(key), "--identity", "alpha"]
        sender = subprocess.Popen([*argv, "--retries", "8", "--retry-delay", "0.2"], stderr=subprocess.PIPE)
        log.wait(lambda e: e["event"] == "refused" and "busy" in str(e.get("reason")), count=2)  # it knocked again
        for sock in held:
            sock.close()
        _, err = sender.communicate(timeout=120)
    assert sender.returncode == 0, err
    assert stored(tmp_path, "alpha")[name_of(FULL)] == FULL.read_bytes()


def test_sources_that_fill_every_place_make_room_for_another(tmp_path: Path) -> None:
    """Four addresses hold all 64 places with silent openings (16 each): a sender from a fifth takes the
    oldest place of one of them, and the one cut is logged with why."""
    port = free_port()
    config = write_config(tmp_path, port, "handshake_timeout = 120", clients=("alpha",))
    held: list[socket.socket] = []
    with service(config, port) as proc:
        for i in range(4):
            _hold_open(port, f"127.0.0.{2 + i}", MAX_PER_SOURCE, b"", held)
        sent = send(port, tmp_path, "alpha", FULL, "--retries", "0")
        for sock in held:
            sock.close()
    assert len(held) == 4 * MAX_PER_SOURCE
    assert sent.returncode == 0, sent.stderr
    reasons = [str(e.get("reason")) for e in events(proc) if e["event"] == "refused"]
    assert any("making room for 127.0.0.1: 127.0.0." in r for r in reasons), reasons


def test_limits_hold_for_transfers_and_lists_that_connect_at_once(tmp_path: Path) -> None:
    """max_per_client and max_transfers are checked and the transfer registered in one step, lists counted
    too: every admitted transfer or list is held where it begins until all have connected, and no more than
    the limits got in."""
    port = free_port()
    config = write_config(tmp_path, port, "max_per_client = 1\nmax_transfers = 2", clients=("alpha", "beta", "gamma"))
    gate, lock, entered = threading.Event(), threading.Lock(), []

    def at_gate(slot: Any) -> None:
        with lock:
            entered.append(slot)
        gate.wait(60)

    class Held(Service):
        def _transfer(self, *args: Any) -> None:
            at_gate(args)
            super()._transfer(*args)

        def _list(self, *args: Any) -> None:
            at_gate(args)
            super()._list(*args)

    lines = io.StringIO()
    with running(Held(load(str(config)), EventLog(lines, "json"))):
        try:
            wait_listening(port)
            jobs: list[tuple[str, tuple[str, ...]]] = [(c, ()) for c in ("alpha", "beta", "gamma") for _ in range(2)]
            jobs += [("alpha", ("--list",)), ("beta", ("--list",))]
            procs = [_sender_of(port, tmp_path, client, FULL, *extra) for client, extra in jobs]
            deadline = time.monotonic() + 60
            while len(entered) + sum(p.poll() is not None for p in procs) < len(procs) and time.monotonic() < deadline:
                time.sleep(0.05)
            admitted = len(entered)
            gate.set()
            results = [(p.wait(60), p.communicate()[1]) for p in procs]
        finally:
            gate.set()  # a failure above must not leave the transfers at the gate
    assert admitted == 2, (admitted, results)
    assert sorted(code for code, _ in results) == [0, 0] + [4] * (len(jobs) - 2), results
    assert all(b"busy: " in err for code, err in results if code), results
    log = [json.loads(line) for line in lines.getvalue().splitlines()]
    began = [e["client"] for e in log if e["event"] in ("transfer", "listed")]
    assert len(began) == 2 and len(set(began)) == 2, log  # one each at most
    refused = [str(e["reason"]) for e in log if e["event"] == "refused"]
    assert len(refused) == len(jobs) - 2 and all(" running" in r for r in refused), refused


def _sender_of(port: int, tmp_path: Path, client: str, stream: Path, *extra: str) -> subprocess.Popen[bytes]:
    key = tmp_path / "keys" / f"{client}.key"
    argv = [*CMD, "send", "--to", f"127.0.0.1:{port}", str(stream), "--key", str(key), "--identity", client]
    return subprocess.Popen([*argv, "--progress", "none", *extra], stderr=subprocess.PIPE)


def _half_sent(port: int, tmp_path: Path, client: str) -> Channel:
    """A raw stream's first half, sent through a TLS channel of ``client``'s key, the rest held."""
    channel = tls_channel(port, tmp_path / "keys" / f"{client}.key", client)
    data = FULL.read_bytes()
    channel.send_all(data[: len(data) // 2])
    return channel


def _rest_sent(channel: Channel) -> bytes:
    """The rest of :func:`_half_sent`'s stream, then the receiver's status (b"" when it cut the connection)."""
    data = FULL.read_bytes()
    buf = bytearray(4096)
    with channel, contextlib.suppress(Exception):
        channel.send_all(data[len(data) // 2 :])
        channel.shutdown_write()
        return bytes(buf[: channel.recv_into(buf)])
    return b""


def test_sighup_reloads_the_configuration_and_cuts_only_what_it_revoked(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha", "beta", "gamma", "delta"))
    first = config.read_text()
    config.write_text(first.split("[clients.delta]")[0])  # delta comes with the reload
    with service(config, port) as proc:
        log = LiveLog(proc)
        running = {client: _half_sent(port, tmp_path, client) for client in ("alpha", "beta", "gamma")}
        log.wait(lambda e: e["event"] == "transfer", count=3)
        key_file(tmp_path / "keys" / "gamma.new.key")
        body = first.replace('[clients.beta]\nkey = "keys/beta.key"\nstore = "places/beta"\n', "")
        config.write_text(body.replace('"keys/gamma.key"', '"keys/gamma.new.key"'))
        proc.send_signal(signal.SIGHUP)
        reloaded = log.wait(lambda e: e["event"] == "reloaded")[0]
        cut = log.wait(lambda e: e["event"] == "failed", count=2)
        statuses = {client: _rest_sent(channel) for client, channel in running.items()}
        added = send(port, tmp_path, "delta", FULL)
        rekeyed = send(port, tmp_path, "gamma", FULL, "--key", str(tmp_path / "keys" / "gamma.new.key"))
        revoked = send(port, tmp_path, "gamma", INCR)

        config.write_text("[clients.alpha\n")  # a wrong file: refused, the running configuration kept
        proc.send_signal(signal.SIGHUP)
        wrong = log.wait(lambda e: e["event"] == "reload-refused")[0]
        config.write_text(body.replace(f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}"))
        proc.send_signal(signal.SIGHUP)
        moved = log.wait(lambda e: e["event"] == "reload-refused", count=2)[1]
        kept = send(port, tmp_path, "delta", INCR)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        every = log.end()
    assert proc.returncode == 0 and every[-1]["event"] == "stopped", every
    assert {k: reloaded.get(k) for k in ("added", "removed", "rekeyed")} == {
        "added": "delta",
        "removed": "beta",
        "rekeyed": "gamma",
    }, reloaded
    assert sorted(str(reloaded["cut"]).replace("@", " ").split(",")) == sorted(
        f"{e['client']} {e['peer']}" for e in cut
    )
    assert {e["client"]: e["reason"] for e in cut} == {
        "beta": "cut: the configuration no longer has client beta",
        "gamma": "cut: the key of client gamma changed",
    }
    assert statuses == {"alpha": b"sendstream-status 0 ok\n", "beta": b"", "gamma": b""}, statuses  # alpha went on
    assert stored(tmp_path, "alpha")[name_of(FULL)] == FULL.read_bytes() and not stored(tmp_path, "beta")
    assert added.returncode == 0 and rekeyed.returncode == 0 and kept.returncode == 0, (added, rekeyed, kept)
    assert revoked.returncode == 6 and b"wrong key or identity" in revoked.stderr, revoked.stderr
    assert "not TOML" in str(wrong["reason"]) and wrong["kept"] == "the running configuration", wrong
    assert "a running service cannot move; restart it to listen elsewhere" in str(moved["reason"]), moved


def test_metrics_on_a_port_in_use_names_the_address(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client", reason="serve --metrics needs prometheus_client (the test extra has it)")
    config = write_config(tmp_path, free_port(), clients=("alpha",))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        scrape = taken.getsockname()[1]
        argv = [*CMD, "serve", "--config", str(config), "--metrics", f"127.0.0.1:{scrape}"]
        result = subprocess.run(argv, capture_output=True, timeout=60)
    assert result.returncode == 4
    assert result.stderr.decode() == (
        f"sendstream: error: listening for metrics on 127.0.0.1:{scrape}: address already in use "
        "(another process listens there: stop it or choose another port)\n"
    )


def test_unencrypted_to_a_service_that_trusts_no_address_is_told_to_use_tls(tmp_path: Path) -> None:
    """No client has a trusted list: a --tls none sender hears why and what to do (no reset, no raw bytes),
    still sending (a plain stream 2 MB long), in a session, or asking for its list."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    big = tmp_path / "big.stream"
    big.write_bytes(FULL.read_bytes() * 8)
    with service(config, port):
        results = [
            send(port, tmp_path, "alpha", big, "--tls", "none"),
            send(port, tmp_path, "alpha", FULL, "--tls", "none", "--resumable", "--retries", "0"),
            send(port, tmp_path, "alpha", FULL, "--tls", "none", "--list"),
        ]
    why = b"which no client's trusted addresses hold: send with --tls tls13-aes128-gcm and the client's key"
    for result in results:
        assert result.returncode == 6 and b"unencrypted from 127.0.0.1:" in result.stderr, result.stderr
        assert why in result.stderr and b"Traceback" not in result.stderr, result.stderr
    assert not stored(tmp_path, "alpha")


def test_a_resumed_transfer_counts_its_bytes_the_same_at_both_ends(tmp_path: Path) -> None:
    """The service kept the first commands of a cut session; the sender sends the rest, and both ends say
    where it resumed and how long the stream is (the service's `bytes` is the stream's size)."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    data = FULL.read_bytes()
    with service(config, port) as proc:
        log = LiveLog(proc)
        with tls_channel(port, tmp_path / "keys" / "alpha.key", "alpha") as cut:
            machine = SenderConnection()
            cut.send_all(machine.send(Hello(stream_identity(data[:65536]))))
            assert Inbox(cut, machine, 4096).next_event() == Answer(0, 0)
            cut.send_all(machine.send(Data(memoryview(data[:20000]))))
            log.wait(lambda e: e["event"] == "transfer")
            cut.interrupt()  # a drop, not an end
        log.wait(lambda e: e["event"] == "failed")
        again = send(port, tmp_path, "alpha", FULL, "--resumable")
        done = log.wait(lambda e: e["event"] == "stored")[0]
    resumed = log.wait(lambda e: e["event"] == "transfer", count=2)[1]["resumed"]
    assert again.returncode == 0 and 0 < resumed < 20000, (again.stderr, resumed)
    assert f"({len(data) - resumed:,} bytes)".encode() in again.stderr, again.stderr
    assert f"resumed at offset {resumed} of {len(data):,} bytes".encode() in again.stderr, again.stderr
    assert done["bytes"] == len(data) and done["resumed"] == resumed, done
    assert stored(tmp_path, "alpha")[name_of(FULL)] == data


# memory: what hostile clients cannot make the service hold (issue 24)

SERVE_MEMORY_BOUND = 150 << 20  # peak RSS of serve (MALLOC_ARENA_MAX=2) under the load below (README)


def _hold_open(port: int, source: str, count: int, first: bytes, held: list[socket.socket]) -> None:
    """``count`` connections from ``source`` that send ``first`` (nothing, a TLS record's first byte,
    junk) and then stay silent, kept in ``held``; those the service refuses are dropped."""
    for _ in range(count):
        sock = socket.socket()
        try:
            sock.bind((source, 0))
            sock.settimeout(5)
            sock.connect(("127.0.0.1", port))
            if first:
                sock.sendall(first)
        except OSError:
            sock.close()
            continue
        held.append(sock)


def test_hostile_clients_leave_the_services_memory_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight transfers of 11 MB (half compressed, half resumable) while 400 silent connections, 48
    slow-loris TLS openings, 32 MiB of junk and senders with a wrong key knock from other addresses:
    every transfer is stored, and the service's peak RSS stays under :data:`SERVE_MEMORY_BOUND`."""
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    port = free_port()
    config = write_config(tmp_path, port)
    streams = [tmp_path / "a.stream", tmp_path / "b.stream"]
    streams[0].write_bytes(FULL.read_bytes() * 40)
    streams[1].write_bytes(INCR.read_bytes() + FULL.read_bytes() * 39)
    wrong = key_file(tmp_path / "wrong.key")
    held: list[socket.socket] = []
    with service(config, port) as proc:
        knocks = [
            threading.Thread(target=_hold_open, args=(port, "127.0.0.2", 400, b"", held)),
            *(
                threading.Thread(target=_hold_open, args=(port, f"127.0.0.{3 + i}", 16, b"\x16\x03", held))
                for i in range(3)
            ),
            threading.Thread(target=_garbage, args=(port, 32 << 20)),
        ]
        for knock in knocks:
            knock.start()

        def sender(client: str, stream: Path, *extra: str) -> subprocess.Popen[bytes]:
            key = str(tmp_path / "keys" / f"{client}.key")
            argv = [*CMD, "send", "--to", f"127.0.0.1:{port}", str(stream), "--key", key, "--identity", client]
            argv += ["--progress", "none", "--retries", "20", "--retry-delay", "0.5", *extra]
            return subprocess.Popen(argv, stderr=subprocess.PIPE)

        pairs = [(c, s) for c in CLIENTS for s in streams]
        jobs = [sender(c, s, *(["--compress", "zstd"] if i % 2 else ["--resumable"])) for i, (c, s) in enumerate(pairs)]
        intruders: list[subprocess.CompletedProcess[bytes]] = []
        for _ in range(4):
            intruder = subprocess.run(
                [*CMD, "send", "--to", f"127.0.0.1:{port}", str(FULL), "--key", str(wrong), "--identity", "alpha",
                 "--progress", "none", "--retries", "0"],
                capture_output=True, timeout=120,
            )  # fmt: skip
            intruders.append(intruder)
        said = [job.communicate(timeout=300)[1] for job in jobs]
        for knock in knocks:
            knock.join()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        peak = int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]
        for sock in held:
            sock.close()
    assert [job.returncode for job in jobs] == [0] * len(jobs), [
        (j.returncode, s[-300:]) for j, s in zip(jobs, said, strict=True)
    ]
    assert all(i.returncode == 6 for i in intruders), [i.stderr for i in intruders]
    for client in CLIENTS:
        assert sorted(stored(tmp_path, client)) == sorted(
            n for s in streams for n in (name_of(s), name_of(s) + ".json")
        )
    assert peak < SERVE_MEMORY_BOUND, f"peak RSS {peak / 1e6:.1f} MB"


def test_a_service_killed_mid_transfer_removes_what_it_left_when_it_starts_again(tmp_path: Path) -> None:
    """A plain transfer's temporary file (nothing resumes it) that a SIGKILL left is removed at the next
    start, and said; a resumable transfer's journal stays for its sender."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    place = tmp_path / "places" / "alpha"
    big = _big(tmp_path)
    with service(config, port) as proc:
        sender = _sender(port, tmp_path, big, "--rate-limit", "2M")  # resumable: its journal stays
        plain = subprocess.Popen(
            [*CMD, "send", "--to", f"127.0.0.1:{port}", str(big), "--key",
             str(tmp_path / "keys" / "alpha.key"), "--identity", "alpha", "--progress", "none", "--retries", "0",
             "--rate-limit", "2M"],
            stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            [p for p in place.glob(".incoming.stream.*.tmp") if p.stat().st_size]
            and [p for p in place.glob(".*.incoming.part") if p.stat().st_size]
        ):
            time.sleep(0.05)  # until both transfers' files hold their first bytes (the events)
        proc.kill()
        proc.wait()
        sender.kill()
        plain.communicate(timeout=60)
    left = sorted(p.name for p in place.iterdir())
    assert any(name.startswith(".incoming.stream.") for name in left), left
    with service(config, port) as proc:
        pass
    log = events(proc)
    assert [e.get("temporaries") for e in log if e["event"] == "removed"] == [1], log
    assert not [p for p in place.iterdir() if p.name.startswith(".incoming.stream.")]
    assert [p.name for p in place.glob(".*.incoming.part")], sorted(p.name for p in place.iterdir())


def test_a_transfer_lets_go_of_its_place_in_the_limits_before_its_sender_hears_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client at ``max_per_client = 1`` may send its next stream as soon as it heard that the last one is
    stored: the service's cleanup after the answer (held here until the second send is done) holds no place."""
    from sendstream.session.receiver import SessionReceiver

    later, closing = threading.Event(), SessionReceiver.close

    def close(self: SessionReceiver) -> None:
        later.wait(120)
        closing(self)

    monkeypatch.setattr(SessionReceiver, "close", close)
    with serving(tmp_path, "max_per_client = 1") as (port, _):
        first = subprocess.run(sending(port, tmp_path, FULL, "--retries", "0"), capture_output=True, timeout=120)
        second = subprocess.run(sending(port, tmp_path, INCR, "--retries", "0"), capture_output=True, timeout=120)
        later.set()
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr


def _dated_streams(tmp_path: Path, days: list[int]) -> list[Path]:
    """Crafted full streams of snapshots ``home.TIME``, one ``days`` ago each (by the clock now)."""
    now = datetime.datetime.now(datetime.UTC)
    paths = []
    for n, ago in enumerate(days):
        name = f"home.{now - datetime.timedelta(days=ago):%Y%m%dT%H%M%S}Z".encode()
        path = tmp_path / f"dated-{n}.stream"
        path.write_bytes(_crafted(_subvol(name), _mkfile(b"f")))
        paths.append(path)
    return paths


def test_the_service_keeps_a_file_place_by_its_clients_policy(tmp_path: Path) -> None:
    """After each transfer the service keeps what the client's policy keeps (by the time in each
    snapshot's name) and logs what went; a stream whose name says no time, and the newest, stay."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    config.write_text(config.read_text() + 'preserve = "3d"\npreserve_min = "no"\n')
    dated = _dated_streams(tmp_path, [30, 10, 2, 1])
    with service(config, port) as proc:
        results = [send(port, tmp_path, "alpha", p) for p in [FULL, *dated]]
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    held = sorted(p for p in stored(tmp_path, "alpha") if not p.endswith(".json"))
    assert held == sorted(name_of(p) for p in (FULL, dated[2], dated[3])), held  # FULL's name says no time
    log = events(proc)
    client = next(e for e in log if e["event"] == "client")
    assert client["preserve"] == "preserve 3d, minimum no"
    pruned = [e for e in log if e["event"] == "pruned"]
    # each went at the end of its own transfer: older than the policy keeps (the minimum is no)
    assert [e["deleted"] for e in pruned] == [[name_of(dated[0])], [name_of(dated[1])]], pruned
    assert set(stored(tmp_path, "alpha")) == {n for h in held for n in (h, h + ".json")}  # no manifest left alone


def test_a_wrong_retention_setting_is_refused_naming_its_line(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    base = config.read_text()
    for extra, said in (
        ('preserve = "7d 3d"\n', "clients.alpha.preserve = '7d 3d': expected each unit once ('d' is given twice)"),
        ('preserve = "7d"\npreserve_min = "2x"\n', "clients.alpha.preserve_min = '2x': expected all, latest, no"),
        ('preserve_min = "2d"\n', "clients.alpha.preserve_min: goes with preserve"),
        ('preserve = "7d"\npreserve_hour_of_day = 25\n', "clients.alpha.preserve_hour_of_day = 25: expected a whole"),
    ):
        config.write_text(base + extra)
        line = base.count("\n") + extra.count("\n")
        checked = subprocess.run([*CMD, "serve", "--config", str(config), "--check-config"], capture_output=True)
        assert checked.returncode == 2, checked.stderr
        assert f"{config}:{line}: {said}".encode() in checked.stderr, checked.stderr


@pytest.mark.btrfs
def test_the_service_keeps_a_receive_place_by_its_clients_policy(tmp_path: Path) -> None:
    need_root_btrfs()
    with btrfs_loop("512M") as mnt:
        port = free_port()
        config = _receive_config(tmp_path, mnt, port, ("alpha",), extra='preserve = "3d"\npreserve_min = "no"')
        dated = _dated_streams(tmp_path, [30, 10, 2, 1])
        with service(config, port) as proc:
            results = [send(port, tmp_path, "alpha", p) for p in dated]
            listed, _ = _arrivals(send(port, tmp_path, "alpha", FULL, "--list").stdout)
        assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
        names = [first_command(p.read_bytes())[1].get("path").decode() for p in dated]  # type: ignore[union-attr]
        assert sorted(os.listdir(mnt / "alpha")) == names[2:]
        assert [line.rpartition(" ")[2] for line in listed] == names[2:]
        pruned = [e for e in events(proc) if e["event"] == "pruned"]
        assert [e["deleted"] for e in pruned] == [[names[0]], [names[1]]], pruned


def test_a_file_place_is_listed_checked_restored_and_pruned_as_an_archive(tmp_path: Path) -> None:
    """The archive's tools on a service's file place (no store, no copy): its chains, every stream checked
    against its manifest (a byte changed is named), the chain of a snapshot handed on by name, a prune."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    with service(config, port):
        results = [send(port, tmp_path, "alpha", p) for p in (FULL, INCR)]
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    place = tmp_path / "places" / "alpha"
    full, incr = (stream_identity(p.read_bytes()[:65536]) for p in (FULL, INCR))

    listed = subprocess.run([*CMD, "archive", "ls", str(place)], capture_output=True)
    lines = listed.stdout.decode().splitlines()
    assert listed.returncode == 0 and len(lines) == 2, listed.stderr
    assert lines[0].startswith(f"{full['uuid']}.7  full  ") and lines[0].endswith("  rich_base")
    assert lines[1].startswith(f"  {incr['uuid']}.9  incremental  ") and lines[1].endswith("  rich_incr")

    checked = subprocess.run([*CMD, "verify", str(place)], capture_output=True)
    assert checked.returncode == 0, checked.stderr
    assert sorted(checked.stdout.decode().splitlines()) == sorted(f"{name_of(p)}: ok" for p in (FULL, INCR))

    back = subprocess.run([*CMD, "restore", str(place / "rich_incr"), "-o", "-"], capture_output=True)
    assert back.returncode == 0 and back.stdout == FULL.read_bytes() + INCR.read_bytes(), back.stderr

    dry = subprocess.run([*CMD, "archive", "prune", str(place), "--keep-last", "1", "--dry-run"], capture_output=True)
    assert dry.returncode == 0 and b"2 kept, 0 would go" in dry.stderr, dry.stderr  # the kept one's parent stays

    stream = place / name_of(INCR)
    data = bytearray(stream.read_bytes())
    data[-100] ^= 1
    stream.write_bytes(bytes(data))
    bad = subprocess.run([*CMD, "verify", str(place)], capture_output=True)
    said = dict(line.split(": ", 1) for line in bad.stdout.decode().splitlines())
    assert bad.returncode == 1 and said[name_of(FULL)] == "ok" and "crc32c mismatch" in said[name_of(INCR)], bad.stdout
    cut = subprocess.run([*CMD, "restore", str(place / "rich_incr"), "-o", str(tmp_path / "out")], capture_output=True)
    assert cut.returncode != 0 and str(stream).encode() in cut.stderr and not (tmp_path / "out").exists(), cut.stderr
    assert b"Traceback" not in bad.stderr + cut.stderr


def test_a_transfer_admitted_while_its_place_is_pruned_waits_until_the_pruning_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service prunes a client's place after a transfer; the client's next transfer, admitted meanwhile,
    must not take its stream (nor look for its parent) until the pruning ends. The pruning is held until that
    transfer reaches its take or 5 s pass: without the wait its take runs inside the pruning, every time."""
    port = free_port()
    config = write_config(tmp_path, port, clients=("alpha",))
    config.write_text(config.read_text() + 'preserve = "3d"\n')
    dated = _dated_streams(tmp_path, [2, 1])
    began, pruning, taking = threading.Event(), threading.Event(), threading.Event()
    overlaps: list[str] = []
    retain, take = files.FilePlace.retain, files.FilePlace.take

    def held_retain(self: files.FilePlace, *args: Any, **kw: Any) -> Any:
        if not began.is_set():  # the first pruning is held
            taking.clear()
            pruning.set()
            began.set()
            taking.wait(5)  # the next transfer's take comes in here without the wait; with it, never
            pruning.clear()
        return retain(self, *args, **kw)

    def watched_take(self: files.FilePlace, *args: Any, **kw: Any) -> Any:
        if pruning.is_set():
            overlaps.append("a take while the place was pruned")
        taking.set()
        return take(self, *args, **kw)

    monkeypatch.setattr(files.FilePlace, "retain", held_retain)
    monkeypatch.setattr(files.FilePlace, "take", watched_take)
    lines = io.StringIO()
    with running(Service(load(str(config)), EventLog(lines, "json"))):
        wait_listening(port)
        first = send(port, tmp_path, "alpha", dated[0])
        assert began.wait(30), "the service did not prune after the transfer"
        second = send(port, tmp_path, "alpha", dated[1])
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert overlaps == []
    assert sorted(p for p in stored(tmp_path, "alpha") if not p.endswith(".json")) == sorted(map(name_of, dated))
