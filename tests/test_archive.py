"""Streams in object storage: ``send --to s3://``, ``archive ls``, ``restore``, ``verify s3://``, against a
real S3 server (SeaweedFS)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.btrfs import need_root_btrfs
from support.loopfs import btrfs_loop
from support.net import CMD, free_port, key_file, wait_listening
from support.s3 import Store, seaweedfs
from support.streams import STREAMS, boundaries
from support.trees import differences

from sendstream.archive.catalog import entries
from sendstream.archive.reading import check
from sendstream.archive.store import Location
from sendstream.archive.upload import upload
from sendstream.codec.crc import crc32c
from sendstream.ops.identity import stream_identity
from sendstream.ops.stored import stream_name

FULL = next(p for p in STREAMS if p.name == "rich-full-v2.stream")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as running:
        yield running


def run(store: Store, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CMD, *args], input=data, capture_output=True, env=store.env, timeout=300)


def name_of(data: bytes) -> str:
    return stream_name(stream_identity(data[: 64 << 10]))


def test_every_fixture_goes_there_and_back_byte_for_byte(store: Store) -> None:
    bucket, client = store.bucket(), store.client()
    for path in STREAMS:
        sent = run(store, "send", "--to", f"s3://{bucket}/{path.stem}", str(path))
        assert sent.returncode == 0, (path.name, sent.stderr)
        assert f"; s3://{bucket}/{path.stem}/{name_of(path.read_bytes())}; ".encode() in sent.stderr
        location = Location(bucket, f"{path.stem}/")
        (entry,) = entries(client, location)
        back = bytearray()
        check(client, location, entry, back.extend)  # what restore hands on, stream by stream
        assert back == path.read_bytes(), path.name
    key = f"rich-full-v2/{name_of(FULL.read_bytes())}.json"
    note = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data = FULL.read_bytes()
    assert note["size"] == len(data) and note["sha256"] == hashlib.sha256(data).hexdigest()
    assert note["snapshot"] == "rich_base" and note["stream"]["uuid"] == stream_identity(data)["uuid"]
    assert note["objects"] == [{"key": name_of(data), "size": len(data)}]
    back = run(store, "restore", f"s3://{bucket}/rich-full-v2/{stream_identity(data)['uuid']}", "-o", "-")
    assert back.returncode == 0 and back.stdout == data, back.stderr


def _long_stream(tmp_path: Path, copies: int = 60) -> tuple[Path, bytes]:
    """A valid stream of ~11 MB: the full fixture's commands, its header once and its END once at the end."""
    data = FULL.read_bytes()
    cuts = boundaries(data)
    header, body, end = data[: cuts[1]], data[cuts[1] : cuts[-2]], data[cuts[-2] :]
    whole = header + body * copies + end
    path = tmp_path / "long.stream"
    path.write_bytes(whole)
    return path, whole


def test_parts_end_on_command_boundaries_and_a_long_stream_spans_objects(store: Store, tmp_path: Path) -> None:
    bucket, client = store.bucket(), store.client()
    path, whole = _long_stream(tmp_path)
    done = upload(str(path), Location(bucket), client, part_size=5 << 20, max_object=11 << 20)
    sizes = [o["size"] for o in done.objects]
    assert len(sizes) == 2 and sum(sizes) == len(whole) and max(sizes) <= 11 << 20, sizes
    cuts = set(boundaries(whole))
    at = 0
    for obj in done.objects:
        held = client.get_object_attributes(Bucket=bucket, Key=obj["key"], ObjectAttributes=["ObjectParts"])
        sizes = [part["Size"] for part in held["ObjectParts"]["Parts"]]
        assert all(size >= 5 << 20 for size in sizes[:-1]) and sum(sizes) == obj["size"], sizes
        for size in sizes:
            at += size
            assert at in cuts  # each part ends where a command ends
    assert [o["key"] for o in done.objects] == [name_of(whole), name_of(whole) + ".1"]
    back = run(store, "restore", f"s3://{bucket}/{stream_identity(whole)['uuid']}", "-o", str(tmp_path / "back"))
    assert back.returncode == 0, back.stderr
    assert (tmp_path / "back").read_bytes() == whole


def test_a_damaged_object_is_found_in_place_with_its_offset(store: Store, tmp_path: Path) -> None:
    bucket, client = store.bucket(), store.client()
    path, whole = _long_stream(tmp_path, copies=8)
    for stream in (path, STREAMS[0]):
        assert run(store, "send", "--to", f"s3://{bucket}/a", str(stream)).returncode == 0
    ok = run(store, "verify", f"s3://{bucket}/a")
    assert ok.returncode == 0 and ok.stdout.decode().count(": ok\n") == 2, ok
    key = f"a/{name_of(whole)}"
    damaged = bytearray(whole)
    damaged[1_000_000] ^= 0x40
    client.put_object(Bucket=bucket, Key=key, Body=bytes(damaged))  # the store's copy, changed behind our back
    bad = run(store, "verify", f"s3://{bucket}/a", "--workers", "2")
    assert bad.returncode == 1, bad
    report = dict(line.split(": ", 1) for line in bad.stdout.decode().splitlines())
    assert report[name_of(STREAMS[0].read_bytes())] == "ok"
    command_at = max(c for c in boundaries(whole) if c <= 1_000_000)
    assert re.match(rf"offset {command_at}, command #\d+ \(\w+\): crc32c mismatch", report[name_of(whole)]), report
    assert b"2 streams checked, 1 bad" in bad.stderr
    restored = run(store, "restore", f"s3://{bucket}/a/{stream_identity(whole)['uuid']}", "-o", str(tmp_path / "r"))
    assert restored.returncode == 1 and f"offset {command_at}".encode() in restored.stderr, restored.stderr
    assert not (tmp_path / "r").exists()  # nothing half written


def test_commands_swapped_behind_our_back_are_found_by_restore_and_verify(store: Store, tmp_path: Path) -> None:
    """Every CRC still holds and the size and count are the same: the ledger is what tells (restore
    leaves the SHA-256 to verify)."""
    bucket, client = store.bucket(), store.client()
    whole = FULL.read_bytes()
    assert run(store, "send", "--to", f"s3://{bucket}/s", str(FULL)).returncode == 0
    cuts = boundaries(whole)
    a, b, c = cuts[10], cuts[11], cuts[12]
    swapped = whole[:a] + whole[b:c] + whole[a:b] + whole[c:]
    client.put_object(Bucket=bucket, Key=f"s/{name_of(whole)}", Body=swapped)
    restored = run(store, "restore", f"s3://{bucket}/s/{stream_identity(whole)['uuid']}", "-o", str(tmp_path / "r"))
    assert restored.returncode == 1 and b"its ledger is not its manifest's" in restored.stderr, restored.stderr
    assert not (tmp_path / "r").exists()
    verified = run(store, "verify", f"s3://{bucket}/s")
    assert verified.returncode == 1 and b"its ledger is not its manifest's" in verified.stdout, verified


def test_a_bad_input_leaves_no_parts_and_no_object(store: Store, tmp_path: Path) -> None:
    bucket, client = store.bucket(), store.client()
    _, whole = _long_stream(tmp_path, copies=40)
    cut = max(c for c in boundaries(whole) if c <= 9 << 20)
    broken = whole[:cut] + b"\xff" * 64 + whole[cut:]  # past the first 8 MiB part
    sent = run(store, "send", "--to", f"s3://{bucket}/x", "-", data=broken)
    assert sent.returncode == 1 and f"offset {cut}".encode() in sent.stderr, sent.stderr
    assert b"Traceback" not in sent.stderr
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def _slow_upload(store: Store, url: str, key: Path, data: bytes, cut: int, *extra: str) -> subprocess.Popen[bytes]:
    """An upload from a pipe fed ``data[:cut]`` at once and the rest never: it waits for more."""
    argv = [*CMD, "send", "--to", url, "-", "--resumable", "--key", str(key), *extra]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=store.env)
    assert proc.stdin is not None
    proc.stdin.write(data[:cut])
    proc.stdin.flush()
    return proc


def _changed(data: bytes, at: int) -> bytes:
    """``data`` with the last byte of the command at ``at`` changed, and its CRC made right: another valid
    stream, the same as ``data`` before that command."""
    start = max(c for c in boundaries(data) if c <= at)
    length = int.from_bytes(data[start : start + 4], "little")
    command = bytearray(data[start : start + 10 + length])
    command[-1] ^= 1
    command[6:10] = bytes(4)
    command[6:10] = crc32c(bytes(command)).to_bytes(4, "little")
    return data[:start] + bytes(command) + data[start + len(command) :]


def _until_state(store: Store, bucket: str, parts: int) -> None:
    """Until the upload's state in the bucket says ``parts`` parts are in."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for item in store.client().list_objects_v2(Bucket=bucket).get("Contents", []):
            if item["Key"].endswith(".upload"):
                body = json.loads(store.client().get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
                if len(body["state"]["parts"]) >= parts:
                    return
        time.sleep(0.1)
    raise AssertionError(f"no upload state with {parts} parts")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_upload_killed_at_a_seeded_point_resumes_to_the_same_object(store: Store, tmp_path: Path, seed: int) -> None:
    """Seed 3 seals its parts too."""
    bucket, client = store.bucket(), store.client()
    path, whole = _long_stream(tmp_path, copies=150)  # 42 MB: five parts of 8 MiB
    key_file(tmp_path / "k.key")
    key_file(tmp_path / "seal.key")
    sealed = ["--encrypt-key", str(tmp_path / "seal.key")] if seed == 3 else []
    cut = random.Random(seed).randrange(17 << 20, len(whole) - (1 << 20))
    proc = _slow_upload(store, f"s3://{bucket}/r", tmp_path / "k.key", whole, cut, *sealed)
    _until_state(store, bucket, (cut >> 23) - 1)
    proc.kill()  # SIGKILL: it says nothing, and its upload stays
    proc.wait()
    changed = _changed(whole, 4 << 20)  # another valid stream, the same but for one command at 4 MiB
    argv = ["send", "--to", f"s3://{bucket}/r", "--resumable", "--key", str(tmp_path / "k.key"), *sealed]
    refused = run(store, *argv, "-", data=changed)
    assert refused.returncode == 2, refused.stderr
    assert b"differs from the earlier upload's before offset" in refused.stderr, refused.stderr
    again = run(store, *argv, str(path), "-v")
    assert again.returncode == 0, again.stderr
    resumed = int(re.search(rb"resumed at offset (\d+)", again.stderr).group(1))  # type: ignore[union-attr]
    assert 16 << 20 <= resumed <= cut, (resumed, cut)
    back = run(store, "restore", f"s3://{bucket}/r/{stream_identity(whole)['uuid']}", "-o", "-", *sealed)
    assert back.returncode == 0 and back.stdout == whole
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # no orphan parts
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {f"r/{name_of(whole)}", f"r/{name_of(whole)}.json"}  # and no state left


def test_a_state_made_with_another_key_is_refused(store: Store, tmp_path: Path) -> None:
    bucket = store.bucket()
    _, whole = _long_stream(tmp_path, copies=80)
    key_file(tmp_path / "k.key")
    key_file(tmp_path / "other.key")
    proc = _slow_upload(store, f"s3://{bucket}/s", tmp_path / "k.key", whole, 17 << 20)
    _until_state(store, bucket, 1)
    proc.kill()
    proc.wait()
    forged = run(
        store, "send", "--to", f"s3://{bucket}/s", "-", "--resumable", "--key", str(tmp_path / "other.key"), data=whole
    )
    assert forged.returncode == 2 and b"its signature does not match this key" in forged.stderr, forged.stderr
    no_key = run(store, "send", "--to", f"s3://{bucket}/s", "-", "--resumable", data=whole)
    assert no_key.returncode == 2 and b"--resumable to s3:// needs --key FILE" in no_key.stderr


def test_the_store_stopped_mid_upload_and_started_again(store: Store, tmp_path: Path) -> None:
    bucket, client = store.bucket(), store.client()
    _, whole = _long_stream(tmp_path, copies=150)
    key_file(tmp_path / "k.key")
    proc = _slow_upload(
        store, f"s3://{bucket}/t", tmp_path / "k.key", whole, 20 << 20, "--retries", "12", "--retry-delay", "0.5"
    )
    _until_state(store, bucket, 1)
    store.stop(signal.SIGKILL)  # (SeaweedFS takes 20 s to stop on SIGTERM; this is the harder case anyway)
    assert proc.stdin is not None
    proc.stdin.write(whole[20 << 20 :])  # the rest comes while the store is away
    proc.stdin.close()
    time.sleep(2)
    store.start()
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.wait(120)
    assert proc.returncode == 0, err
    assert b"retry 1/12" in err, err
    back = run(store, "restore", f"s3://{bucket}/t/{stream_identity(whole)['uuid']}", "-o", "-")
    assert back.returncode == 0 and back.stdout == whole
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_sealed_parts_leave_nothing_readable_in_the_store(store: Store, tmp_path: Path) -> None:
    bucket, client = store.bucket(), store.client()
    path, whole = _long_stream(tmp_path, copies=40)  # 11 MB: two parts
    for name in ("k", "other"):
        key_file(tmp_path / f"{name}.key")
    sealed = ["--encrypt-key", str(tmp_path / "k.key")]
    incr = next(p for p in STREAMS if p.name == "rich-incr-v2.stream")
    for stream in (path, incr):
        assert run(store, "send", "--to", f"s3://{bucket}/e", str(stream), *sealed).returncode == 0
    stored = {
        o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        for o in client.list_objects_v2(Bucket=bucket)["Contents"]
    }
    data = FULL.read_bytes()
    cuts = boundaries(data)
    samples = [
        b"rich_base",
        b"rich_incr",
        *(data[c + 10 : c + 42] for c in cuts[1:-1:50]),
    ]  # names, and pieces of every kind of command
    for key, body in stored.items():
        assert not any(sample in body for sample in samples), key
    note = json.loads(stored[f"e/{name_of(whole)}.json"])
    assert note["encryption"]["cipher"] == "AES-256-GCM" and "snapshot" not in note
    assert [len(p) for p in (o["parts"] for o in note["objects"])] == [2]
    uuid = stream_identity(whole)["uuid"]
    back = run(store, "restore", f"s3://{bucket}/e/{uuid}", "-o", "-", *sealed)
    assert back.returncode == 0 and back.stdout == whole, back.stderr
    plain = run(store, "restore", f"s3://{bucket}/e/{uuid}", "-o", "-")
    assert plain.returncode == 2 and b"is encrypted (sha256:" in plain.stderr and b"--encrypt-key" in plain.stderr
    other = run(store, "restore", f"s3://{bucket}/e/{uuid}", "-o", "-", "--encrypt-key", str(tmp_path / "other.key"))
    assert other.returncode == 2 and b"is sealed with key sha256:" in other.stderr
    ok = run(store, "verify", f"s3://{bucket}/e", *sealed)
    assert ok.returncode == 0 and ok.stdout.decode().count(": ok\n") == 2, ok
    body = bytearray(stored[f"e/{name_of(whole)}"])
    body[(9 << 20)] ^= 1  # in the second part
    client.put_object(Bucket=bucket, Key=f"e/{name_of(whole)}", Body=bytes(body))
    bad = run(store, "verify", f"s3://{bucket}/e", *sealed)
    first = note["objects"][0]["parts"][0] - 28  # where the second part's content starts in the stream
    assert (
        bad.returncode == 1
        and f"offset {first}: differs from its manifest: part 2 does not open".encode() in bad.stdout
    ), bad


def test_the_same_stream_twice_is_refused_and_ls_shows_chains(store: Store) -> None:
    bucket = store.bucket()
    full, incr = FULL, next(p for p in STREAMS if p.name == "rich-incr-v2.stream")
    for stream in (full, incr):
        assert run(store, "send", "--to", f"s3://{bucket}/h", str(stream)).returncode == 0
    again = run(store, "send", "--to", f"s3://{bucket}/h", str(full))
    assert again.returncode == 2 and b"archived already" in again.stderr, again.stderr
    listed = run(store, "archive", "ls", f"s3://{bucket}/h")
    lines = listed.stdout.decode().splitlines()
    f, i = (stream_identity(p.read_bytes()) for p in (full, incr))
    assert lines[0].startswith(f"{f['uuid']}.{f['ctransid']}  full  ") and lines[0].endswith("rich_base")
    assert lines[1].startswith(f"  {i['uuid']}.{i['ctransid']}  incremental  ") and lines[1].endswith("rich_incr")
    listed = run(store, "archive", "ls", "--json", f"s3://{bucket}/h").stdout.decode().splitlines()
    assert [(x["uuid"], x["depth"]) for x in map(json.loads, listed)] == [(f["uuid"], 0), (i["uuid"], 1)]
    both = run(store, "restore", f"s3://{bucket}/h/{i['uuid']}", "-o", "-")
    assert both.returncode == 0 and both.stdout == full.read_bytes() + incr.read_bytes()
    assert b"; 2 streams: " in both.stderr


def test_a_missing_link_is_named(store: Store) -> None:
    bucket = store.bucket()
    incr = next(p for p in STREAMS if p.name == "rich-incr-v2.stream")
    assert run(store, "send", "--to", f"s3://{bucket}", str(incr)).returncode == 0
    i = stream_identity(incr.read_bytes())
    lost = run(store, "restore", f"s3://{bucket}/{i['uuid']}", "-o", "-")
    assert lost.returncode == 2 and lost.stdout == b""
    assert (
        f"needs its parent {i['parent_uuid']} at ctransid {i['parent_ctransid']}, which is not archived".encode()
        in lost.stderr
    )
    unknown = run(store, "restore", f"s3://{bucket}/00000000-0000-0000-0000-000000000000", "-o", "-")
    assert unknown.returncode == 9 and b"no archived stream makes snapshot" in unknown.stderr


def test_errors_of_the_store_name_the_object(store: Store) -> None:
    missing = run(store, "archive", "ls", "s3://no-such-bucket-here/p")
    assert (
        missing.returncode == 4
        and b"s3://no-such-bucket-here/p/: " in missing.stderr
        and b"NoSuchBucket" in missing.stderr
    )
    bad = run(store, "send", "--to", "s3://B", str(FULL))
    assert bad.returncode == 2 and b"is not a bucket name" in bad.stderr


def test_prune_keeps_what_a_kept_snapshot_builds_on(store: Store) -> None:
    bucket = store.bucket()
    other, full, incr = (
        next(p for p in STREAMS if p.name == n)
        for n in ("verity-v3.stream", "rich-full-v2.stream", "rich-incr-v2.stream")
    )
    for stream in (other, full, incr):
        assert run(store, "send", "--to", f"s3://{bucket}/p", str(stream)).returncode == 0
        time.sleep(1.1)  # stored one second after another: the manifests say which is older
    names = [name_of(p.read_bytes()) for p in (other, full, incr)]
    dry = run(store, "archive", "prune", f"s3://{bucket}/p", "--keep-last", "1", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.decode().startswith(f"would delete {names[0]}  ")
    assert b"2 kept, 1 would go" in dry.stderr
    assert len(entries(store.client(), Location(bucket, "p/"))) == 3
    pruned = run(store, "archive", "prune", f"s3://{bucket}/p", "--keep-last", "1")
    assert pruned.returncode == 0 and pruned.stdout.decode().splitlines() == [
        line.replace("would delete", "deleted") for line in dry.stdout.decode().splitlines()
    ]
    keys = {o["Key"] for o in store.client().list_objects_v2(Bucket=bucket)["Contents"]}
    assert keys == {f"p/{n}{suffix}" for n in names[1:] for suffix in ("", ".json")}  # the parent of the kept one stays
    back = run(store, "restore", f"s3://{bucket}/p/{stream_identity(incr.read_bytes())['uuid']}", "-o", "-")
    assert back.returncode == 0 and back.stdout == full.read_bytes() + incr.read_bytes()
    bad = run(store, "archive", "prune", f"s3://{bucket}/p", "--keep-since", "yesterday")
    assert bad.returncode == 2 and b"is not an ISO date" in bad.stderr


def test_the_service_stores_a_clients_streams_in_its_bucket(store: Store, tmp_path: Path) -> None:
    bucket = store.bucket()
    port = free_port()
    key_file(tmp_path / "alpha.key")
    config = tmp_path / "serve.toml"
    config.write_text(
        f'listen = "127.0.0.1:{port}"\n[clients.alpha]\nkey = "alpha.key"\nstore = "s3://{bucket}/alpha"\n'
    )
    full, incr = (next(p for p in STREAMS if p.name == n) for n in ("rich-full-v2.stream", "rich-incr-v2.stream"))
    argv = [*CMD, "serve", "--config", str(config), "--log-format", "json"]
    with subprocess.Popen(argv, stderr=subprocess.PIPE, env=store.env) as proc:
        try:
            wait_listening(port)
            client = ["--to", f"127.0.0.1:{port}", "--key", str(tmp_path / "alpha.key"), "--identity", "alpha"]
            sent = [run(store, "send", *client, str(full)), run(store, "send", *client, str(incr), "--resumable")]
            listed = run(store, "send", *client, "--list", str(full))
        finally:
            proc.terminate()
            proc.wait(30)
            log = proc.stderr.read().decode()  # type: ignore[union-attr]
    assert all(r.returncode == 0 for r in sent), [r.stderr for r in sent]
    f, i = (stream_identity(p.read_bytes()) for p in (full, incr))
    assert listed.stdout.decode().splitlines() == sorted(
        [
            f"{f['uuid']}.{f['ctransid']} full {name_of(full.read_bytes())}",
            f"{i['uuid']}.{i['ctransid']} from {f['uuid']}.{f['ctransid']} {name_of(incr.read_bytes())}",
        ]
    ), listed
    back = run(store, "restore", f"s3://{bucket}/alpha/{i['uuid']}", "-o", "-")
    assert back.returncode == 0 and back.stdout == full.read_bytes() + incr.read_bytes(), back.stderr
    (entry, _) = sorted(entries(store.client(), Location(bucket, "alpha/")), key=lambda x: x.ctransid)
    note = json.loads(store.client().get_object(Bucket=bucket, Key=f"alpha/{entry.name}.json")["Body"].read())
    assert note["client"] == "alpha" and note["peer"].startswith("127.0.0.1:") and "host" not in note
    stored = [json.loads(line) for line in log.splitlines() if '"stored"' in line]
    assert [x["stream"] for x in stored] == [name_of(full.read_bytes()), name_of(incr.read_bytes())]


@pytest.mark.btrfs
def test_a_chain_restored_into_btrfs_receive_is_the_direct_transfer(store: Store, tmp_path: Path) -> None:
    """A full stream and two incrementals of a real file system, archived, then restored by the last
    snapshot's UUID into btrfs receive; and a 1 GiB stream there and back byte for byte."""
    need_root_btrfs()
    bucket = store.bucket()
    streams = [tmp_path / f"{n}.stream" for n in ("s1", "s2", "s3")]
    with btrfs_loop("2G") as src:
        subprocess.run(["btrfs", "-q", "subvolume", "create", str(src / "vol")], check=True)
        block = os.urandom(1 << 20)
        with open(src / "vol" / "big", "wb") as f:
            for _ in range(1024):
                f.write(block)
        parent = None
        for n, stream in enumerate(streams, 1):
            (src / "vol" / f"small{n}").write_bytes(os.urandom(4096 * n))
            snap = src / f"s{n}"
            subprocess.run(["btrfs", "-q", "subvolume", "snapshot", "-r", str(src / "vol"), str(snap)], check=True)
            extra = ["-p", str(parent)] if parent else []
            subprocess.run(["btrfs", "send", "-q", *extra, "-f", str(stream), str(snap)], check=True)
            parent = snap
        last = subprocess.run(["btrfs", "subvolume", "show", str(parent)], capture_output=True, text=True, check=True)
        last_uuid = re.search(r"^\s*UUID:\s+(\S+)", last.stdout, re.M).group(1)  # type: ignore[union-attr]
    assert streams[0].stat().st_size > 1 << 30
    for stream in streams:
        sent = run(store, "send", "--to", f"s3://{bucket}/host", str(stream))
        assert sent.returncode == 0, sent.stderr
    whole = hashlib.sha256()
    with subprocess.Popen(
        [*CMD, "restore", f"s3://{bucket}/host/{stream_identity(streams[0].read_bytes()[:65536])['uuid']}", "-o", "-"],
        stdout=subprocess.PIPE, env=store.env,
    ) as big:  # fmt: skip
        assert big.stdout is not None
        while chunk := big.stdout.read(1 << 20):
            whole.update(chunk)
    assert big.returncode == 0
    with open(streams[0], "rb") as f:
        assert whole.hexdigest() == hashlib.file_digest(f, "sha256").hexdigest()
    with btrfs_loop("3G") as mnt:
        (mnt / "restored").mkdir()
        (mnt / "direct").mkdir()
        restored = run(
            store, "restore", f"s3://{bucket}/host/{last_uuid}", "--exec", f"btrfs receive {mnt / 'restored'}"
        )
        assert restored.returncode == 0, restored.stderr
        assert b"; 3 streams: " in restored.stderr
        for stream in streams:
            subprocess.run(
                ["btrfs", "receive", "-f", str(stream), str(mnt / "direct")], capture_output=True, check=True
            )
        for n in (1, 2, 3):
            assert differences(mnt / "direct" / f"s{n}", mnt / "restored" / f"s{n}") == []
    assert len(entries(store.client(), Location(bucket, "host/"))) == 3


# --- the archive's commands: END held back, names, nothing found, progress, order (issue 24) ---------------------

INCR = next(p for p in STREAMS if p.name == "rich-incr-v2.stream")
END_SIZE = 10  # the END command: a command header, no attributes


def test_restore_holds_a_stream_s_end_back_until_it_is_its_manifest_s(store: Store) -> None:
    """Two commands swapped, END moved before the last command, a second stream after the END: whatever
    the stream is, its consumer gets all of it but its END, which (in btrfs receive) finalizes it."""
    bucket, client = store.bucket(), store.client()
    whole = FULL.read_bytes()
    assert run(store, "send", "--to", f"s3://{bucket}/s", str(FULL)).returncode == 0
    cuts = boundaries(whole)
    a, b, c, end = cuts[10], cuts[11], cuts[12], cuts[-2]
    last = cuts[-3]
    swapped = whole[:a] + whole[b:c] + whole[a:b] + whole[c:]
    note = json.loads(client.get_object(Bucket=bucket, Key=f"s/{name_of(whole)}.json")["Body"].read())
    for tampered, handed, words in (
        (swapped, len(whole) - END_SIZE, b"its ledger is not its manifest's"),
        (whole[:last] + whole[end:] + whole[last:end], last, b"after the END of stream 1"),
        (whole + INCR.read_bytes(), len(whole) - END_SIZE, b"a second stream begins after its END"),
    ):
        client.put_object(Bucket=bucket, Key=f"s/{name_of(whole)}", Body=tampered)
        note["size"] = note["objects"][0]["size"] = len(tampered)  # the manifest tampered with as well
        client.put_object(Bucket=bucket, Key=f"s/{name_of(whole)}.json", Body=json.dumps(note).encode())
        back = run(store, "restore", f"s3://{bucket}/s/{stream_identity(whole)['uuid']}", "-o", "-")
        assert back.returncode == 1 and words in back.stderr, back.stderr
        assert back.stdout == tampered[:handed], (len(back.stdout), handed)
        assert f"standard output was given {handed} bytes of it, not its END".encode() in back.stderr, back.stderr
        assert b"'rich_base' is left a writable subvolume" in back.stderr, back.stderr


def _received(path: Path) -> tuple[str, str]:
    """Whether the subvolume at ``path`` is read-only, and its received UUID ('-': none)."""
    ro = subprocess.run(["btrfs", "property", "get", "-ts", str(path), "ro"], capture_output=True, text=True)
    shown = subprocess.run(["btrfs", "subvolume", "show", str(path)], capture_output=True, text=True, check=True)
    received = re.search(r"^\s*Received UUID:\s+(\S+)", shown.stdout, re.M)
    return ro.stdout.strip(), received.group(1) if received else "-"


@pytest.mark.btrfs
def test_two_commands_swapped_in_the_store_leave_no_received_subvolume(store: Store) -> None:
    """Into a real btrfs receive: the tampered stream is refused before its END, so the subvolume is
    writable and not received, and the error says so and how to remove it; then the sound chain goes in."""
    need_root_btrfs()
    bucket, client = store.bucket(), store.client()
    whole = FULL.read_bytes()
    for stream in (FULL, INCR):
        assert run(store, "send", "--to", f"s3://{bucket}/s", str(stream)).returncode == 0
    cuts = boundaries(whole)
    a, b, c = cuts[10], cuts[11], cuts[12]
    client.put_object(Bucket=bucket, Key=f"s/{name_of(whole)}", Body=whole[:a] + whole[b:c] + whole[a:b] + whole[c:])
    uuid = stream_identity(INCR.read_bytes())["uuid"]
    with btrfs_loop("512M") as mnt:
        refused = run(store, "restore", f"s3://{bucket}/s/{uuid}", "--exec", f"btrfs receive {mnt}")
        err = refused.stderr.decode()
        assert refused.returncode == 1 and "its ledger is not its manifest's" in err, err
        assert f"s3://{bucket}/s/{name_of(whole)}: " in err and "'btrfs receive " in err, err
        assert "'rich_base' is left a writable subvolume that was not received" in err, err
        assert "btrfs subvolume delete DIR/rich_base" in err, err
        assert _received(mnt / "rich_base") == ("ro=false", "-")
        assert not (mnt / "rich_incr").exists()
        subprocess.run(["btrfs", "-q", "subvolume", "delete", str(mnt / "rich_base")], check=True)
        client.put_object(Bucket=bucket, Key=f"s/{name_of(whole)}", Body=whole)
        restored = run(store, "restore", f"s3://{bucket}/s/{uuid}", "--exec", f"btrfs receive {mnt}")
        assert restored.returncode == 0, restored.stderr
        assert _received(mnt / "rich_incr")[0] == "ro=true" and _received(mnt / "rich_base")[1] != "-"


def test_restore_takes_a_snapshot_s_name_and_resolves_before_the_child_starts(store: Store, tmp_path: Path) -> None:
    bucket = store.bucket()
    for stream in (FULL, INCR):
        assert run(store, "send", "--to", f"s3://{bucket}/n", str(stream)).returncode == 0
    both = run(store, "restore", f"s3://{bucket}/n/rich_incr", "-o", "-")
    assert both.returncode == 0 and both.stdout == FULL.read_bytes() + INCR.read_bytes(), both.stderr
    again = _changed(FULL.read_bytes(), 17)  # rich_base once more, at another ctransid
    assert run(store, "send", "--to", f"s3://{bucket}/n", "-", data=again).returncode == 0
    key_file(tmp_path / "k.key")
    sealed = ["--encrypt-key", str(tmp_path / "k.key")]
    assert run(store, "send", "--to", f"s3://{bucket}/e", str(FULL), *sealed).returncode == 0
    f, g = stream_identity(FULL.read_bytes()), stream_identity(again)
    marker = tmp_path / "started"
    for url, code, words in (
        (f"s3://{bucket}/n/rich_base", 2, f"2 archived snapshots are called 'rich_base': {f['uuid']}.{f['ctransid']}"),
        (f"s3://{bucket}/n/rich_base", 2, f"{g['uuid']}.{g['ctransid']} (stored "),
        (f"s3://{bucket}/n/rich_nowhere", 9, "no archived stream makes snapshot 'rich_nowhere'"),
        (f"s3://{bucket}/n/00000000-0000-0000-0000-000000000000", 9, "no archived stream makes snapshot"),
        (f"s3://{bucket}/typo/rich_base", 9, f"s3://{bucket}/typo/: nothing is archived here"),
        (f"s3://{bucket}/e/{f['uuid']}", 2, "is encrypted (sha256:"),
    ):
        refused = run(store, "restore", url, "--exec", f"touch {marker}; cat >/dev/null")
        err = refused.stderr.decode()
        assert refused.returncode == code and words in err and "Traceback" not in err, (url, err)
        assert not marker.exists() and len(err.splitlines()) == 1, (url, err)  # no child, so no "empty stream"


def test_nothing_found_is_an_error_of_its_own(store: Store) -> None:
    bucket = store.bucket()
    assert run(store, "send", "--to", f"s3://{bucket}/host", str(FULL)).returncode == 0
    typo, top = f"s3://{bucket}/typo", f"s3://{bucket}"
    for url, args in (
        (typo, ["verify", typo]),
        (typo, ["archive", "ls", typo]),
        (typo, ["archive", "ls", "--json", typo]),
        (typo, ["archive", "prune", typo, "--keep-last", "1"]),
        (top, ["verify", top]),  # only the streams directly under the prefix count
    ):
        found = run(store, *args)
        (line,) = found.stderr.decode().splitlines()
        assert found.returncode == 9 and found.stdout == b"", (args, line)
        assert line.startswith(f"sendstream: error: {url}/: nothing is archived here"), line


def test_archive_ls_json_is_a_line_per_stream_and_verify_goes_in_chain_order(store: Store) -> None:
    bucket = store.bucket()
    other = next(p for p in STREAMS if p.name == "verity-v3.stream")
    for stream in (INCR, other, FULL):  # by name: the incremental (0160...) comes first, the full (5751...) last
        assert run(store, "send", "--to", f"s3://{bucket}/h", str(stream)).returncode == 0
    listed = run(store, "archive", "ls", "--json", f"s3://{bucket}/h")
    lines = [json.loads(line) for line in listed.stdout.decode().splitlines()]
    f, i, o = (stream_identity(p.read_bytes()) for p in (FULL, INCR, other))
    assert [(x["uuid"], x["depth"], x["parent"]) for x in lines] == [
        (o["uuid"], 0, None),  # chains oldest first (by ctransid): verity_snap's 5, then rich_base's 7
        (f["uuid"], 0, None),
        (i["uuid"], 1, [f["uuid"], f["ctransid"]]),
    ], lines
    assert set(lines[0]) == {"name", "uuid", "ctransid", "parent", "snapshot", "size", "stored", "depth"}
    verified = run(store, "verify", f"s3://{bucket}/h")
    order = [line.split(":")[0] for line in verified.stdout.decode().splitlines()]
    assert verified.returncode == 0 and order == [x["name"] for x in lines], verified


def test_upload_and_restore_show_progress_time_and_rate_as_send_does(store: Store) -> None:
    bucket = store.bucket()
    whole = FULL.read_bytes() + INCR.read_bytes()
    sent = run(store, "send", "--to", f"s3://{bucket}/p", str(FULL), "--progress", "plain:0.000001")
    err = sent.stderr.decode()
    assert sent.returncode == 0 and re.search(r"^sendstream: archived \S+ \S+ \d:\d\d:\d\d \[.*/s\]", err, re.M), err
    assert f"({len(FULL.read_bytes()):,} bytes) in " in err.splitlines()[-1], err
    assert run(store, "send", "--to", f"s3://{bucket}/p", str(INCR), "-q").stderr == b""
    back = run(store, "restore", f"s3://{bucket}/p/rich_incr", "-o", "-", "--progress", "plain:0.000001")
    err = back.stderr.decode()
    assert back.returncode == 0 and back.stdout == whole, err
    assert re.search(r"^sendstream: restored \S+ \S+ \d:\d\d:\d\d \[.*/s\] +\d+% ETA ", err, re.M), err
    assert re.search(rf"^sendstream: restored .* \({len(whole):,} bytes\) in .*; 2 streams: ", err, re.M), err
    quiet = run(store, "restore", f"s3://{bucket}/p/rich_incr", "-o", "-", "-q")
    assert quiet.returncode == 0 and quiet.stderr == b"" and quiet.stdout == whole
