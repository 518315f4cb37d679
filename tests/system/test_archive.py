"""Streams in object storage: ``send --to s3://``, ``archive ls``, ``restore``, ``verify s3://``, against a
real S3 server (SeaweedFS)."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.btrfs import need_root_btrfs
from support.loopfs import btrfs_loop
from support.lying_store import Pattern, lying_store
from support.net import CMD, free_port, key_file, wait_listening
from support.rss import peak_rss
from support.s3 import Store, seaweedfs
from support.streams import STREAMS, boundaries
from support.trees import differences

from sendstream import errors as e
from sendstream.archive.catalog import MAX_LISTED, chains, entries, plan_prune, read_manifest
from sendstream.archive.reading import check
from sendstream.archive.seal import SEGMENT, Sealer, opened_size, sealed_size
from sendstream.archive.store import BucketClient, Location
from sendstream.archive.upload import upload
from sendstream.codec.crc import crc32c
from sendstream.retention import policy
from sendstream.stores.bucket import Bucket
from sendstream.transfer.identity import Identity, stream_identity
from sendstream.transfer.stored import manifest, stream_name

FULL = next(p for p in STREAMS if p.name == "rich-full-v2.stream")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as running:
        yield running


def run(
    store: Store, *args: str, data: bytes | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CMD, *args], input=data, capture_output=True, env=store.env, timeout=timeout)


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
    restored = run(store, "restore", f"s3://{bucket}/rich-full-v2/{stream_identity(data)['uuid']}", "-o", "-")
    assert restored.returncode == 0 and restored.stdout == data, restored.stderr


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


class _Failing(io.RawIOBase):
    """A pipe that breaks after ``data[:cut]``."""

    def __init__(self, data: bytes, cut: int) -> None:
        self.data, self.cut, self.pos = data, cut, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        if self.pos >= self.cut:
            raise OSError(5, "the pipe broke")
        n = min(len(b), self.cut - self.pos)
        b[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def test_a_sealed_upload_that_completed_an_object_resumes(store: Store, tmp_path: Path) -> None:
    """Its state says where the sealed parts of the object it completed are (a list in each object: JSON
    5 deep), and is taken up (found by fuzzing: it was refused as nesting too deeply)."""
    bucket, client = store.bucket(), store.client()
    _, whole = _long_stream(tmp_path, copies=120)  # 33 MB: objects of two 5 MiB parts
    sealer, key, location = Sealer(os.urandom(32)), os.urandom(32), Location(bucket, "o/")
    options = {"part_size": 5 << 20, "max_object": 11 << 20, "key": key, "sealer": sealer}
    with pytest.raises(OSError, match="the pipe broke"):
        upload(_Failing(whole, 18 << 20), location, client, **options)  # type: ignore[arg-type]
    done = upload(io.BytesIO(whole), location, client, **options)  # type: ignore[arg-type]
    assert done.resumed >= 10 << 20 and len(done.objects) > 2, (done.resumed, done.objects)
    back = bytearray()
    check(client, location, read_manifest(client, location, name_of(whole) + ".json"), back.extend, sealer)
    assert back == whole


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
    assert proc.stderr is not None
    said = b""
    while b"retry 1/12" not in said:  # the store comes back only once the upload has found it away
        line = proc.stderr.readline()
        assert line, said
        said += line
    store.start()
    err = said + proc.stderr.read()
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
    first = opened_size(note["objects"][0]["parts"][0])  # where the second part's content starts in the stream
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
    as_json = run(store, "archive", "ls", "--json", f"s3://{bucket}/h").stdout.decode().splitlines()
    assert [(x["uuid"], x["depth"]) for x in map(json.loads, as_json)] == [(f["uuid"], 0), (i["uuid"], 1)]
    both = run(store, "restore", f"s3://{bucket}/h/{i['uuid']}", "-o", "-")
    assert both.returncode == 0 and both.stdout == full.read_bytes() + incr.read_bytes()
    assert b"; 2 streams: " in both.stderr


def test_ls_escapes_what_a_manifest_says(store: Store) -> None:
    """A manifest's snapshot name and time are its writer's words: ``archive ls`` shows them escaped, on
    the stream's one line (they went to the terminal as they were)."""
    bucket, client = store.bucket(), store.client()
    assert run(store, "send", "--to", f"s3://{bucket}/w", str(FULL)).returncode == 0
    key = f"w/{name_of(FULL.read_bytes())}.json"
    note = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    note.update(snapshot="snap\x1b]0;owned\x07\nforged", stored="2026-12-01\x1b[2J")
    client.put_object(Bucket=bucket, Key=key, Body=json.dumps(note).encode())
    listed = run(store, "archive", "ls", f"s3://{bucket}/w")
    assert listed.returncode == 0 and listed.stdout.count(b"\n") == 1 and b"\x1b" not in listed.stdout, listed
    assert listed.stdout.endswith(b"2026-12-01\\x1b[2J  snap\\x1b]0;owned\\x07\\nforged\n"), listed.stdout


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
    assert [line.rpartition(" arrived ")[0] for line in listed.stdout.decode().splitlines()] == sorted(
        [
            f"{f['uuid']}.{f['ctransid']} full {name_of(full.read_bytes())} snapshot rich_base",
            f"{i['uuid']}.{i['ctransid']} from {f['uuid']}.{f['ctransid']} {name_of(incr.read_bytes())}"
            " snapshot rich_incr",
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
            extra: list[str] = ["-p", str(parent)] if parent else []
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


# --- an archive that lies: what anyone who can write to the bucket, or a broken store, can do -------------------

OTHER = next(p for p in STREAMS if p.name == "compressed-v2.stream")
MEMORY_BOUND = 200 << 20  # peak RSS of restore, verify and archive ls, whatever the store answers (README)


def _forged(
    uuid: str,
    ctransid: int,
    parent: tuple[str, int] | None = None,
    stored: str = "2020-01-01T00:00:00+00:00",
    size: int = 100,
    **sealed: object,
) -> tuple[str, bytes]:
    """The name and manifest of a stream of ``size`` bytes that says what its name says, in one object
    (never stored); ``sealed``: ``encryption``, and the object's ``held`` size and ``parts``."""
    identity: Identity = {
        "version": 2, "command": "snapshot" if parent else "subvol", "uuid": uuid, "ctransid": ctransid,
        "parent_uuid": parent[0] if parent else None, "parent_ctransid": parent[1] if parent else None,
        "prefix": 0, "sha256": "0" * 64,
    }  # fmt: skip
    name = stream_name(identity)
    held = {"size": sealed.pop("held"), "parts": sealed.pop("parts")} if sealed else {"size": size}
    note = manifest(
        identity, size=size, sha256="0" * 64, commands=1, ledger="0", objects=[{"key": name, **held}],
        stored=stored, host="forged", **sealed,
    )  # fmt: skip
    return name, note


def _uuid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def _keys(store: Store, bucket: str) -> set[str]:
    return {o["Key"] for page in store.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])}  # fmt: skip


def test_with_a_key_a_plain_stream_in_place_of_a_sealed_one_is_refused(store: Store, tmp_path: Path) -> None:
    bucket, client = store.bucket(), store.client()
    sealed = ["--encrypt-key", str(key_file(tmp_path / "k.key"))]
    assert run(store, "send", "--to", f"s3://{bucket}/e", str(FULL), *sealed).returncode == 0
    assert run(store, "send", "--to", f"s3://{bucket}/p", str(FULL)).returncode == 0
    name = name_of(FULL.read_bytes())
    for key in (name, name + ".json"):  # the plain stream and its manifest put over the sealed ones
        client.copy_object(Bucket=bucket, Key=f"e/{key}", CopySource={"Bucket": bucket, "Key": f"p/{key}"})
    uuid = stream_identity(FULL.read_bytes())["uuid"]
    back = run(store, "restore", f"s3://{bucket}/e/{uuid}", "-o", "-", *sealed)
    refused = f"s3://{bucket}/e/{name} is not encrypted, but --encrypt-key was given: refused".encode()
    assert back.returncode == 2 and back.stdout == b"" and refused in back.stderr, back.stderr
    verified = run(store, "verify", f"s3://{bucket}/e", *sealed)
    assert verified.returncode == 1 and refused in verified.stdout, verified


def test_a_stream_that_is_not_what_its_name_says_is_refused(store: Store) -> None:
    """Another snapshot's stream put in place of one, its manifest made to match in all but the identity."""
    bucket, client = store.bucket(), store.client()
    for stream, prefix in ((FULL, "s"), (OTHER, "o")):
        assert run(store, "send", "--to", f"s3://{bucket}/{prefix}", str(stream)).returncode == 0
    name, other = name_of(FULL.read_bytes()), name_of(OTHER.read_bytes())
    note = json.loads(client.get_object(Bucket=bucket, Key=f"s/{name}.json")["Body"].read())
    theirs = json.loads(client.get_object(Bucket=bucket, Key=f"o/{other}.json")["Body"].read())
    note.update({k: theirs[k] for k in ("size", "sha256", "commands", "ledger", "version")})
    note["objects"][0]["size"] = theirs["size"]
    client.put_object(Bucket=bucket, Key=f"s/{name}", Body=OTHER.read_bytes())
    client.put_object(Bucket=bucket, Key=f"s/{name}.json", Body=json.dumps(note).encode())
    said = stream_identity(OTHER.read_bytes())
    wrong = f"offset 17: differs from its manifest: its first command is a subvol of {said['uuid']} at ctransid 12"
    back = run(store, "restore", f"s3://{bucket}/s/{stream_identity(FULL.read_bytes())['uuid']}", "-o", "-")
    assert back.returncode == 1 and back.stdout == b"" and wrong.encode() in back.stderr, back.stderr
    verified = run(store, "verify", f"s3://{bucket}/s")
    assert verified.returncode == 1 and wrong.encode() in verified.stdout, verified


def test_bad_manifests_are_named_and_the_rest_is_read(store: Store) -> None:
    """Junk, JSON that is no object, a manifest of another stream than its name, and a damaged one in the
    middle of a chain: each named; the good streams listed, verified, restored, and pruned with care."""
    bucket, client = store.bucket(), store.client()
    for stream in (FULL, INCR):
        assert run(store, "send", "--to", f"s3://{bucket}/b", str(stream)).returncode == 0
    first, _ = _forged(_uuid(1), 1)
    middle, _ = _forged(_uuid(2), 2, (_uuid(1), 1))
    last, last_note = _forged(_uuid(3), 3, (_uuid(2), 2), stored="2020-03-01T00:00:00+00:00")
    bad = {
        _forged(_uuid(7), 7)[0]: b"\x00junk",
        _forged(_uuid(8), 8)[0]: b"[1, 2]",
        _forged(_uuid(9), 9)[0]: _forged(_uuid(10), 10)[1],  # says another stream than its name
        middle: _forged(_uuid(2), 2, (_uuid(1), 1))[1][:-40],  # cut short
    }
    for name, body in {**bad, first: _forged(_uuid(1), 1)[1], last: last_note}.items():
        client.put_object(Bucket=bucket, Key=f"b/{name}.json", Body=body)
    listed = run(store, "archive", "ls", f"s3://{bucket}/b")
    assert listed.returncode == 1 and b"Traceback" not in listed.stderr, listed.stderr
    f, i = (stream_identity(p.read_bytes()) for p in (FULL, INCR))
    assert [line.split("  ")[:2] for line in listed.stdout.decode().splitlines()] == [
        [f"{_uuid(1)}.1", "full"], [f"{_uuid(3)}.3", "incremental, parent missing"],
        [f"{f['uuid']}.{f['ctransid']}", "full"], ["", f"{i['uuid']}.{i['ctransid']}"],
    ]  # fmt: skip
    why = dict(zip(bad, [
        "not valid JSON", "the manifest is [1, 2], not a JSON object",
        f"its stream is {_uuid(10)} at ctransid 10, not {_uuid(9)} at ctransid 9 as its name says", "not valid JSON",
    ], strict=True))  # fmt: skip
    errors = sorted(line for line in listed.stderr.decode().splitlines() if line.startswith("sendstream: error: "))
    assert len(errors) == 4, listed.stderr
    for line, name in zip(errors, sorted(bad), strict=True):
        assert line.startswith(f"sendstream: error: s3://{bucket}/b/{name}.json: not a sound manifest: ")
        assert why[name] in line, line
    verified = run(store, "verify", f"s3://{bucket}/b")
    report = dict(line.split(": ", 1) for line in verified.stdout.decode().splitlines())
    assert verified.returncode == 1 and report[name_of(FULL.read_bytes())] == "ok", verified
    assert report[name_of(INCR.read_bytes())] == "ok" and all(report[name].startswith("not a sound") for name in bad)
    back = run(store, "restore", f"s3://{bucket}/b/{i['uuid']}", "-o", "-")
    assert back.returncode == 0 and back.stdout == FULL.read_bytes() + INCR.read_bytes(), back.stderr
    before = _keys(store, bucket)
    pruned = run(store, "archive", "prune", f"s3://{bucket}/b", "--keep-since", "2020-02-01")
    assert pruned.returncode == 1 and b"4 kept, 0 deleted" in pruned.stderr, (
        pruned.stderr
    )  # the first by the middle's name
    assert _keys(store, bucket) == before


def test_a_forged_manifest_makes_prune_delete_no_kept_stream(store: Store) -> None:
    """An old manifest naming a kept stream's objects, and a --keep-last larger than the archive."""
    bucket, client = store.bucket(), store.client()
    for stream in (FULL, INCR):
        assert run(store, "send", "--to", f"s3://{bucket}/f", str(stream)).returncode == 0
    names = [name_of(p.read_bytes()) for p in (FULL, INCR)]
    forged, note = _forged(_uuid(1), 1, stored="2019-01-01T00:00:00+00:00")
    body = json.loads(note)
    body["objects"] = [
        {"key": n, "size": s} for n, s in zip(names, (FULL.stat().st_size, INCR.stat().st_size), strict=True)
    ]
    body["size"] = sum(o["size"] for o in body["objects"])
    client.put_object(Bucket=bucket, Key=f"f/{forged}.json", Body=json.dumps(body).encode())
    old, old_note = _forged(_uuid(2), 2, stored="2019-02-01T00:00:00+00:00")  # sound, and older than the rest
    client.put_object(Bucket=bucket, Key=f"f/{old}.json", Body=old_note)
    before = _keys(store, bucket)
    pruned = run(store, "archive", "prune", f"s3://{bucket}/f", "--keep-last", "5")
    assert pruned.returncode == 1 and b"3 kept, 0 deleted" in pruned.stderr, pruned.stderr
    assert f"{forged}.json: not a sound manifest: its objects are".encode() in pruned.stderr
    assert _keys(store, bucket) == before
    pruned = run(store, "archive", "prune", f"s3://{bucket}/f", "--keep-last", "1")
    assert pruned.returncode == 1 and b"2 kept, 1 deleted" in pruned.stderr, pruned.stderr
    assert _keys(store, bucket) == before - {f"f/{old}.json"}  # the kept ones' objects all there
    back = run(store, "restore", f"s3://{bucket}/f/{stream_identity(INCR.read_bytes())['uuid']}", "-o", "-")
    assert back.returncode == 0 and back.stdout == FULL.read_bytes() + INCR.read_bytes()


def test_a_resumed_upload_is_sealed_as_it_began(store: Store, tmp_path: Path) -> None:
    bucket = store.bucket()
    path, whole = _long_stream(tmp_path, copies=80)  # 22 MB: three parts
    key, seal = key_file(tmp_path / "k.key"), key_file(tmp_path / "seal.key")
    proc = _slow_upload(store, f"s3://{bucket}/m", key, whole, 17 << 20)
    _until_state(store, bucket, 1)
    proc.kill()
    proc.wait()
    argv = ["send", "--to", f"s3://{bucket}/m", str(path), "--resumable", "--key", str(key)]
    sealed = run(store, *argv, "--encrypt-key", str(seal))
    assert sealed.returncode == 2, sealed.stderr
    assert (
        b"the earlier run's parts are not encrypted, this run's would be sealed with key sha256:" in sealed.stderr
        and b"run it again without --encrypt-key; or start over: delete s3://" in sealed.stderr
    ), sealed.stderr
    plain = run(store, *argv)
    assert plain.returncode == 0 and b"resumed at offset" in plain.stderr, plain.stderr
    back = run(store, "restore", f"s3://{bucket}/m/{stream_identity(whole)['uuid']}", "-o", "-")
    assert back.returncode == 0 and back.stdout == whole


def test_a_prefix_keeps_one_sealing_unless_told_to_change(store: Store, tmp_path: Path) -> None:
    bucket = store.bucket()
    key, other = (["--encrypt-key", str(key_file(tmp_path / f"{n}.key"))] for n in ("k", "other"))
    assert run(store, "send", "--to", f"s3://{bucket}/k", str(FULL), *key).returncode == 0
    forgot = run(store, "send", "--to", f"s3://{bucket}/k", str(INCR))
    assert forgot.returncode == 2 and f"s3://{bucket}/k/: its streams are sealed with key sha256:".encode() in (
        forgot.stderr
    ), forgot.stderr
    assert b"this one would not be: give --encrypt-key FILE of that key, or --change-sealing" in forgot.stderr
    wrong = run(store, "send", "--to", f"s3://{bucket}/k", str(INCR), *other)
    assert wrong.returncode == 2 and b"this one would be sealed with key sha256:" in wrong.stderr, wrong.stderr
    assert run(store, "send", "--to", f"s3://{bucket}/k", str(INCR), *key).returncode == 0
    assert run(store, "send", "--to", f"s3://{bucket}/q", str(FULL)).returncode == 0
    sealed = run(store, "send", "--to", f"s3://{bucket}/q", str(INCR), *key)
    assert sealed.returncode == 2 and b"its streams are not encrypted" in sealed.stderr, sealed.stderr
    changed = run(store, "send", "--to", f"s3://{bucket}/q", str(INCR), *key, "--change-sealing")
    assert changed.returncode == 0, changed.stderr
    assert len(_keys(store, bucket)) == 8  # two streams and their manifests in each prefix, nothing else


def test_a_store_that_ignores_ranges_costs_no_memory(store: Store, tmp_path: Path) -> None:
    """restore and verify against a store that answers every ranged GET with the whole object (256 MiB),
    and restore from a store that behaves (42 MB, SeaweedFS): each within the bound."""
    name, note = _forged(_uuid(1), 1, size=256 << 20)
    with lying_store() as liar:
        liar.honour_range = False
        liar.objects.update({name: Pattern(256 << 20, os.urandom(1 << 20)), f"{name}.json": note})
        argv = [*CMD, "restore", f"s3://liar/{_uuid(1)}", "-o", os.devnull]
        restored, peak = peak_rss(argv, liar.env(), tmp_path / "r")
        assert restored.returncode == 4 and b"bytes 0-8388607 came back as 268435456 bytes" in restored.stderr, restored
        assert peak < MEMORY_BOUND, peak
        verified, peak = peak_rss([*CMD, "verify", "s3://liar", "--workers", "1"], liar.env(), tmp_path / "v")
        assert verified.returncode == 1 and b"came back as 268435456 bytes" in verified.stdout, verified
        assert peak < MEMORY_BOUND, peak
    bucket = store.bucket()
    path, whole = _long_stream(tmp_path, copies=150)
    assert run(store, "send", "--to", f"s3://{bucket}", str(path)).returncode == 0
    argv = [*CMD, "restore", f"s3://{bucket}/{stream_identity(whole)['uuid']}", "-o", os.devnull]
    restored, peak = peak_rss(argv, store.env, tmp_path / "s")
    assert restored.returncode == 0 and peak < MEMORY_BOUND, (restored, peak)


def test_a_sealed_part_of_512_mib_is_opened_a_segment_at_a_time(tmp_path: Path) -> None:
    key, part = key_file(tmp_path / "k.key"), sealed_size(512 << 20)
    encryption = {"cipher": "AES-256-GCM", "key": Sealer(key.read_bytes()).fingerprint, "segment": SEGMENT}
    name, note = _forged(_uuid(1), 1, size=512 << 20, encryption=encryption, held=part, parts=[part])
    with lying_store() as liar:
        liar.objects.update({name: Pattern(part, os.urandom(1 << 20)), f"{name}.json": note})
        argv = [*CMD, "restore", f"s3://liar/{_uuid(1)}", "-o", os.devnull, "--encrypt-key", str(key)]
        restored, peak = peak_rss(argv, liar.env(), tmp_path / "r")
    assert restored.returncode == 1 and b"offset 0: differs from its manifest: part 1 does not open" in restored.stderr
    assert peak < MEMORY_BOUND, peak


def test_a_listing_that_never_ends_is_cut_off(tmp_path: Path) -> None:
    with lying_store() as liar:
        liar.endless = ".stream.json"
        listed, peak = peak_rss([*CMD, "archive", "ls", "s3://liar/p"], liar.env(), tmp_path / "r", timeout=120)
        pages = liar.pages
    assert listed.returncode == 4, listed
    assert f"s3://liar/p/: the listing goes on past {MAX_LISTED:,} keys".encode() in listed.stderr, listed.stderr
    assert pages == MAX_LISTED // 1000 + 1 and peak < MEMORY_BOUND, (pages, peak)


def test_a_chain_longer_than_pythons_recursion_limit_is_listed_and_pruned(store: Store) -> None:
    """Manifests only (listing and planning need no objects): 1,100 incrementals, past the depth of 997 at
    which a recursive walk failed; 10,000 are walked in-process below."""
    bucket, client = store.bucket(), store.client()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda m: client.put_object(Bucket=bucket, Key=f"c/{m[0]}.json", Body=m[1]), _chain(1_100)))
    listed = run(store, "archive", "ls", f"s3://{bucket}/c")
    lines = listed.stdout.decode().splitlines()
    assert listed.returncode == 0 and len(lines) == 1_100, listed.stderr
    assert lines[-1].startswith("  " * 1_099 + f"{_uuid(1_100)}.1100  incremental  ")
    dry = run(store, "archive", "prune", f"s3://{bucket}/c", "--keep-last", "1", "--dry-run")
    assert dry.returncode == 0 and b"1100 kept, 0 would go" in dry.stderr, dry.stderr


def test_a_chain_of_ten_thousand_streams_is_walked() -> None:
    """27 years of daily incrementals, each manifest read as from the store; listed and planned at once."""
    found = [
        read_manifest(cast(BucketClient, _Answering(note)), Location("b"), f"{name}.json")
        for name, note in _chain(10_000)
    ]
    (tree,) = chains(found)
    assert [(depth, x.ctransid) for depth, x in tree] == [(n, n + 1) for n in range(10_000)]
    kept, dropped = plan_prune(found, keep_last=1)
    assert len(kept) == 10_000 and dropped == []


def _chain(length: int) -> list[tuple[str, bytes]]:
    """A full stream and ``length - 1`` incrementals, each on the one before: names and manifests."""
    return [_forged(_uuid(n), n, (_uuid(n - 1), n - 1) if n > 1 else None) for n in range(1, length + 1)]


def test_streams_whose_parents_go_round_are_named_and_kept(store: Store) -> None:
    bucket, client = store.bucket(), store.client()
    assert run(store, "send", "--to", f"s3://{bucket}/o", str(FULL)).returncode == 0
    circle = [_forged(_uuid(1), 1, (_uuid(2), 2)), _forged(_uuid(2), 2, (_uuid(1), 1))]
    above = _forged(_uuid(3), 3, (_uuid(1), 1))
    for name, note in [*circle, above]:
        client.put_object(Bucket=bucket, Key=f"o/{name}.json", Body=note)
    listed = run(store, "archive", "ls", f"s3://{bucket}/o", timeout=60)
    assert listed.returncode == 1 and listed.stdout.decode().startswith(name_of(FULL.read_bytes())[:-9]), listed
    names = sorted(name for name, _ in circle)
    assert (
        f"sendstream: error: {', '.join(names)}: each of these streams builds on the next, and the last on the "
        "first: a circle of parents".encode()
        in listed.stderr
    ), listed.stderr
    assert f"sendstream: error: {above[0]}: builds on a circle of parents (above)".encode() in listed.stderr
    before = _keys(store, bucket)
    for dry in (["--dry-run"], []):
        pruned = run(store, "archive", "prune", f"s3://{bucket}/o", "--keep-last", "1", *dry, timeout=60)
        assert pruned.returncode == 1 and b"4 kept, 0 " in pruned.stderr and b"a circle" in pruned.stderr, pruned
    assert _keys(store, bucket) == before


@settings(deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    ),
    st.sampled_from(["format", "stream", "objects", "size", "encryption", "parts", "key", "uuid", None]),
)
def test_any_manifest_reads_as_an_entry_or_our_error(value: object, field: str | None) -> None:
    """A sound manifest with one field replaced by any JSON, or any JSON at all: an entry or BadManifest."""
    name, note = _forged(_uuid(1), 1)
    body = json.loads(note)
    body["encryption"] = {"cipher": "AES-256-GCM", "key": "k", "segment": SEGMENT}
    body["objects"][0]["parts"] = [128]
    if field in ("parts", "key"):
        body["objects"][0][field] = value
    elif field == "uuid":
        body["stream"][field] = value
    elif field is not None:
        body[field] = value
    for raw in (json.dumps(body).encode(), json.dumps(value).encode()):
        with contextlib.suppress(e.BadManifest):
            read_manifest(cast(BucketClient, _Answering(raw)), Location("b"), f"{name}.json")


class _Answering:
    """A client whose GetObject answers ``raw``: the manifest parser alone, with no store."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def get_object(self, **_: object) -> dict[str, object]:
        return {"Body": io.BytesIO(self._raw)}


def _dated(n: int, when: datetime.datetime, parent: int | None = None, subvolume: str = "home") -> tuple[str, bytes]:
    """The name and manifest of snapshot ``n`` of ``subvolume``, named for ``when`` as btrbk names it."""
    identity: Identity = {
        "version": 2, "command": "snapshot" if parent else "subvol", "uuid": _uuid(n), "ctransid": n,
        "parent_uuid": _uuid(parent) if parent else None, "parent_ctransid": parent,
        "prefix": 0, "sha256": "0" * 64,
    }  # fmt: skip
    name = stream_name(identity)
    note = manifest(
        identity, size=100, sha256="0" * 64, commands=1, ledger="0", objects=[{"key": name, "size": 100}],
        stored="2020-01-01T00:00:00+00:00", host="forged", snapshot=f"{subvolume}.{when:%Y%m%dT%H%M%S}Z",
    )  # fmt: skip
    return name, note


def test_a_preserve_policy_keeps_by_the_time_in_each_snapshots_name() -> None:
    """Daily snapshots of two subvolumes over 40 days, each a full stream every 10 days and otherwise an
    incremental on the day before; planned at a fixed now with "3d 2w": by the snapshots' own times
    (all were stored at once), subvolume by subvolume, with every chain a kept one needs."""
    now = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.UTC)  # a Friday
    found = []
    for base, subvolume in ((0, "home"), (100, "var")):
        for day in range(40):
            n = base + day + 1
            when = now - datetime.timedelta(days=39 - day, hours=11)  # 01:00 each day
            name, note = _dated(n, when, None if day % 10 == 0 else n - 1, subvolume)
            found.append(read_manifest(cast(BucketClient, _Answering(note)), Location("b"), f"{name}.json"))
    p = policy("3d 2w", "no", tz=datetime.UTC)
    kept, dropped = plan_prune(found, policy=p, now=now)
    for base in (0, 100):
        days = sorted(x.ctransid - base - 1 for x in kept if base < x.ctransid <= base + 40)
        # 3d: days 36-39 (Dec 1-4, 0-3 days ago); 2w: the first of the weeks 0-2 weeks ago, from Sundays
        # Nov 29, 22 and 15 (days 34, 27, 20); and their chains back to the full streams of days 20 and 30.
        # Days 28 and 29 go: no kept one builds on them
        assert days == [*range(20, 28), *range(30, 40)], days
    assert len(dropped) == 44 and all((x.ctransid % 100) - 1 in (*range(20), 28, 29) for x in dropped)
    wide = plan_prune(found, policy=policy("3d 2w 2m", "no", tz=datetime.UTC), now=now)[0]
    assert len(wide) > len(kept)  # November's and October's firsts, with theirs


def test_prune_takes_a_preserve_policy_and_names_a_bad_one(store: Store) -> None:
    bucket, client = store.bucket(), store.client()
    now = datetime.datetime.now(datetime.UTC)
    ages = {1: 40, 2: 20, 3: 10, 4: 2}  # days; 4 is an incremental on 2
    for n, days in ages.items():
        name, note = _dated(n, now - datetime.timedelta(days=days), 2 if n == 4 else None)
        client.put_object(Bucket=bucket, Key=f"r/{name}.json", Body=note)
        client.put_object(Bucket=bucket, Key=f"r/{name}", Body=b"\0" * 100)
    dry = run(store, "archive", "prune", f"s3://{bucket}/r", "--preserve", "7d", "--preserve-min", "no", "--dry-run")
    assert dry.returncode == 0 and b"2 kept, 2 would go" in dry.stderr, dry.stderr
    gone = [line.split()[2] for line in dry.stdout.decode().splitlines()]
    assert sorted(gone) == sorted(_dated(n, now)[0] for n in (1, 3))
    bad = run(store, "archive", "prune", f"s3://{bucket}/r", "--preserve", "7d 3d")
    assert bad.returncode == 2 and b"preserve = '7d 3d': expected each unit once ('d' is given twice)" in bad.stderr
    alone = run(store, "archive", "prune", f"s3://{bucket}/r", "--preserve-min", "2d")
    assert alone.returncode == 2 and b"--preserve-min goes with --preserve POLICY" in alone.stderr
    assert len(entries(client, Location(bucket, "r/"))) == 4  # nothing was deleted
    # the store's retain (a service's policy): the same plan, carried out
    retained = Bucket(f"s3://{bucket}/r", store.client).retain(policy("7d", "no"), now)
    assert sorted(retained.dropped) == sorted(gone) and len(retained.kept) == 2
    assert sorted(x.name for x in entries(client, Location(bucket, "r/"))) == sorted(retained.kept)


def test_a_kept_snapshot_keeps_every_stream_that_makes_it_and_a_bucket_manifest_lists_its_objects() -> None:
    """A snapshot made by a full stream and by an incremental whose parent is gone: either may be the one
    whose chain is whole, so a policy that keeps the snapshot keeps both. A file place's manifest names no
    objects (the stream is one file); a bucket's must, or it is a bad manifest."""
    now = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.UTC)
    when = now - datetime.timedelta(days=1)
    full_name, full_note = _dated(5, when)
    incr_name, incr_note = _dated(5, when, parent=4)  # the same snapshot, from a parent not archived
    found = [
        read_manifest(cast(BucketClient, _Answering(note)), Location("b"), f"{name}.json")
        for name, note in ((incr_name, incr_note), (full_name, full_note))
    ]
    kept, dropped = plan_prune(found, policy=policy("2d", "no", tz=datetime.UTC), now=now)
    assert sorted(x.name for x in kept) == sorted([full_name, incr_name]) and dropped == []
    bare = json.loads(full_note)
    del bare["objects"]
    raw = json.dumps(bare).encode()
    with pytest.raises(e.BadManifest, match="its objects is null, not a list"):
        read_manifest(cast(BucketClient, _Answering(raw)), Location("b"), f"{full_name}.json")
