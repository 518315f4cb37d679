"""One Store interface: a client's place says its kind, a file place says what it holds from its manifests,
and a bucket archives, checks and hands on streams (through a client of this test's own) where the others say
they cannot.

Taking a stream into each kind is tested end to end through ``sendstream serve`` (tests/system/test_serve.py,
and tests/system/test_archive.py for a bucket, with SeaweedFS); here is what needs no service.
"""

from __future__ import annotations

import datetime
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from botocore.exceptions import ClientError
from support.streams import FIXTURES

from sendstream import errors as e
from sendstream.archive.store import BucketClient
from sendstream.retention import policy
from sendstream.service.config import Client
from sendstream.session.protocol import PREFIX_SIZE
from sendstream.stores import at
from sendstream.stores.bucket import Bucket
from sendstream.stores.files import FilePlace
from sendstream.stores.received import ReceivePlace
from sendstream.stores.store import Store, Unsupported, incoming_name
from sendstream.transfer.identity import Identity, stream_identity
from sendstream.transfer.stored import manifest, stream_name

FULL = FIXTURES / "rich-full-v2.stream"
INCR = FIXTURES / "rich-incr-v2.stream"


def _identity(path: Path) -> Identity:
    return stream_identity(path.read_bytes()[:PREFIX_SIZE])


@pytest.mark.parametrize(
    ("place", "receive", "kind", "journaled"),
    [("/srv/alpha", False, FilePlace, True), ("/srv/alpha", True, ReceivePlace, True),
     ("s3://backups/alpha", False, Bucket, False)],
)  # fmt: skip
def test_a_client_s_place_says_the_kind_of_its_store(place: str, receive: bool, kind: type, journaled: bool) -> None:
    store = Client("alpha", b"k" * 32, place, receive=receive).store(lambda: pytest.fail("no bucket is reached"))
    assert type(store) is kind and store.place == place
    identity = _identity(FULL)
    expected = f"{place}/{incoming_name(identity)}" if journaled else None
    assert store.journal(identity) == expected
    assert (store.taken, store.named_as) == (("received", "subvolumes") if receive else ("stored", "stream"))


def test_a_file_place_holds_what_its_manifests_say_by_name(tmp_path: Path) -> None:
    """Each ``NAME.stream.json`` beside its stream is a snapshot held; a hidden manifest (being written), one
    that is not JSON, and one of another shape are not."""
    for path in (INCR, FULL):
        size = path.stat().st_size
        said = {"snapshot": "rich_base"} if path == FULL else {}  # an older manifest does not say it
        note = manifest(
            _identity(path), size=size, sha256="0" * 64, commands=1, ledger="0", client="a", peer="p", **said
        )
        (tmp_path / (stream_name(_identity(path)) + ".json")).write_bytes(note)
    (tmp_path / ".hidden.stream.json").write_bytes(note)
    (tmp_path / "torn.stream.json").write_bytes(note[:20])
    (tmp_path / "other.stream.json").write_bytes(b"[1, 2]")

    held = FilePlace(str(tmp_path)).held()

    full, incr = _identity(FULL), _identity(INCR)
    assert [s["name"] for s in held] == sorted(stream_name(i) for i in (full, incr))
    for snapshot in held:
        path, identity = (FULL, full) if snapshot["name"] == stream_name(full) else (INCR, incr)
        assert set(snapshot) == {
            "name", "snapshot", "uuid", "ctransid", "parent_uuid", "parent_ctransid", "size", "stored", "arrived"
        }  # fmt: skip
        assert snapshot["snapshot"] == ("rich_base" if path == FULL else None)
        assert snapshot["arrived"] == snapshot["stored"]
        assert (snapshot["uuid"], snapshot["ctransid"]) == (identity["uuid"], identity["ctransid"])
        assert (snapshot["parent_uuid"], snapshot["parent_ctransid"]) == (
            identity["parent_uuid"], identity["parent_ctransid"]
        )  # fmt: skip
        assert snapshot["size"] == path.stat().st_size
    assert incr["parent_uuid"] == full["uuid"]  # what a script picks the parent of its next incremental by


class _Objects:
    """An S3 client of this test's own: objects in a dict, and only the calls a bucket store makes to
    archive, list and read them. It keeps what it is given; a test may change an object behind the
    store's back (a store that lies)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self._uploads: dict[str, dict[int, bytes]] = {}

    def _held(self, key: str, operation: str) -> bytes:
        if key not in self.objects:
            raise ClientError({"Error": {"Code": "NoSuchKey"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, operation)
        return self.objects[key]

    def get_object(self, *, Bucket: str, Key: str, Range: str | None = None) -> dict[str, Any]:
        data = self._held(Key, "GetObject")
        if Range is not None:
            start, end = Range.removeprefix("bytes=").split("-")
            data = data[int(start) : int(end) + 1]
        return {"Body": io.BytesIO(data), "ContentLength": len(data)}

    def head_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        return {"ContentLength": len(self._held(Key, "HeadObject"))}

    def put_object(self, *, Bucket: str, Key: str, Body: bytes) -> dict[str, Any]:
        self.objects[Key] = bytes(Body)
        return {}

    def create_multipart_upload(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        upload_id = f"{Key}#{len(self._uploads)}"
        self._uploads[upload_id] = {}
        return {"UploadId": upload_id}

    def upload_part(self, *, UploadId: str, PartNumber: int, Body: bytes, **_: object) -> dict[str, Any]:
        self._uploads[UploadId][PartNumber] = bytes(Body)
        return {"ETag": f'"{PartNumber}"'}

    def complete_multipart_upload(
        self, *, Key: str, UploadId: str, MultipartUpload: dict[str, list[dict[str, Any]]], **_: object
    ) -> dict[str, Any]:
        parts = self._uploads.pop(UploadId)
        self.objects[Key] = b"".join(parts[p["PartNumber"]] for p in MultipartUpload["Parts"])
        return {}

    def get_paginator(self, operation: str) -> _Objects:
        assert operation == "list_objects_v2"
        return self

    def paginate(self, *, Bucket: str, Prefix: str, **_: str) -> Iterator[dict[str, Any]]:
        keys = sorted(k for k in self.objects if k.startswith(Prefix) and "/" not in k[len(Prefix) :])
        when = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
        yield {"Contents": [{"Key": key, "LastModified": when} for key in keys]}


def _bucket(objects: _Objects, place: str = "s3://backups/alpha") -> Bucket:
    return Bucket(place, lambda: cast(BucketClient, objects))


@pytest.mark.parametrize("sealed", [False, True])
def test_a_bucket_archives_streams_and_hands_on_the_chain_that_makes_a_snapshot(sealed: bool) -> None:
    objects, key = _Objects(), (bytes(range(32)) if sealed else None)
    store = _bucket(objects)
    done = [store.upload(str(path), encrypt_key=key) for path in (FULL, INCR)]

    full, incr = _identity(FULL), _identity(INCR)
    assert [x.url for x in done] == [f"s3://backups/alpha/{stream_name(i)}" for i in (full, incr)]
    held = {s["uuid"]: s["parent_uuid"] for s in store.held()}
    assert held == {full["uuid"]: None, incr["uuid"]: full["uuid"]}
    chain = store.chain(str(incr["uuid"]), key)
    assert [entry.name for entry in chain] == [stream_name(full), stream_name(incr)]  # the full stream first
    handed = bytearray()
    store.restore(chain, handed.extend, key)
    assert bytes(handed) == FULL.read_bytes() + INCR.read_bytes()
    if sealed:  # nothing of the stream is readable in the store
        assert not any(FULL.read_bytes()[PREFIX_SIZE : PREFIX_SIZE + 64] in data for data in objects.objects.values())
        with pytest.raises(e.SendStreamError, match="--encrypt-key"):
            store.chain(str(incr["uuid"]))


def test_a_bucket_that_lies_about_a_stream_is_found_out_before_its_end_goes_on() -> None:
    objects = _Objects()
    store = _bucket(objects)
    store.upload(str(FULL))
    name = f"alpha/{stream_name(_identity(FULL))}"
    (held,) = (k for k in objects.objects if k.startswith(name) and not k.endswith(".json"))
    data = bytearray(objects.objects[held])
    data[-20] ^= 1  # in the last command: the stream's CRC says so, not a check of this test's
    objects.objects[held] = bytes(data)
    handed = bytearray()
    with pytest.raises(e.RestoreStopped, match="crc32c mismatch"):
        store.restore(store.chain(str(_identity(FULL)["uuid"])), handed.extend)
    assert len(handed) < len(data) - 20  # nothing from the damaged command on, and not the END


def test_holding_names_the_bucket_of_a_snapshot_and_the_snapshot() -> None:
    store, snapshot = Bucket.holding("s3://backups/host1/home.20261201", "http://127.0.0.1:1")
    assert (store.place, store.location.prefix, snapshot) == ("s3://backups/host1/", "host1/", "home.20261201")
    assert store.endpoint_url == "http://127.0.0.1:1"
    assert Bucket.holding("s3://backups/a//b")[0].location.prefix == "a//"  # the prefix as the URL says it
    with pytest.raises(e.UsageError, match="names no snapshot"):
        Bucket.holding("s3://backups")
    with pytest.raises(e.UsageError, match="is not an s3://BUCKET/PREFIX address"):
        Bucket.holding("/srv/alpha/home")


def test_verify_names_a_manifest_it_cannot_take_and_refuses_a_key_of_the_wrong_size_first() -> None:
    """(A stream itself is checked in a process of its own with its own connection: tests/system/test_archive.py.)"""
    objects = _Objects()
    objects.objects["alpha/torn.stream.json"] = b'{"stream": '
    (verdict,) = _bucket(objects).verify(workers=1)
    assert verdict.name == "torn.stream" and verdict.problem
    never = Bucket("s3://backups/alpha", lambda: pytest.fail("no bucket is reached"))
    with pytest.raises(e.UsageError, match="an encryption key is 32 bytes"):
        never.verify(encrypt_key=b"short")


@pytest.mark.parametrize("kind", [FilePlace, ReceivePlace])
def test_a_place_that_is_not_a_bucket_says_what_it_cannot_do(kind: type[Store], tmp_path: Path) -> None:
    """Neither takes an upload; a btrfs receive place is no archive either (a file place is: it is read,
    checked, restored from and pruned as one, tests/system/test_serve.py)."""
    store = kind(str(tmp_path))
    calls: list[Callable[[], object]] = [lambda: store.upload(str(FULL))]
    if kind is ReceivePlace:
        calls += [lambda: store.verify(), lambda: store.chain("home"), lambda: store.restore([], lambda data: None)]
    for call in calls:
        with pytest.raises(Unsupported, match=f"^{str(tmp_path)!r}: a {store.kind} cannot .*; a bucket .* can$"):
            call()


def test_the_store_a_command_reaches_itself_is_a_bucket_or_a_file_place(tmp_path: Path) -> None:
    store = at("s3://backups/alpha", "http://127.0.0.1:1")  # made, not reached
    assert isinstance(store, Bucket) and store.endpoint_url == "http://127.0.0.1:1"
    place = at(str(tmp_path))
    assert isinstance(place, FilePlace) and place.place == str(tmp_path)
    assert [at(place) for place in (str(FULL), "-", "backup.example:7000", str(tmp_path / "none"))] == [None] * 4


def test_a_file_place_keeps_what_its_policy_keeps_and_every_chain_a_kept_stream_needs(tmp_path: Path) -> None:
    """A chain full(20 days ago) <- incremental(19) <- incremental(1), a lone full stream (10 days ago) and
    one whose manifest says no snapshot name; "2d" with no minimum at a fixed now: the chain stays for its
    newest, the lone one goes (manifest and stream), the one that cannot be placed stays."""
    now = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.UTC)

    def stored(n: int, ago: int | None, parent: int | None = None) -> str:
        uuid = f"00000000-0000-4000-8000-{n:012d}"
        identity: Identity = {
            "version": 2, "command": "snapshot" if parent else "subvol", "uuid": uuid, "ctransid": n,
            "parent_uuid": f"00000000-0000-4000-8000-{parent:012d}" if parent else None,
            "parent_ctransid": parent, "prefix": 0, "sha256": "0" * 64,
        }  # fmt: skip
        name = stream_name(identity)
        said = {} if ago is None else {"snapshot": f"home.{now - datetime.timedelta(days=ago):%Y%m%dT%H%M%S}Z"}
        note = manifest(identity, size=1, sha256="0" * 64, commands=1, ledger="0", client="a", peer="p", **said)
        (tmp_path / name).write_bytes(b"s")
        (tmp_path / (name + ".json")).write_bytes(note)
        return name

    chain = [stored(1, 20), stored(2, 19, 1), stored(3, 1, 2)]
    lone, timeless = stored(4, 10), stored(5, None)
    place, p = FilePlace(str(tmp_path)), policy("2d", "no", tz=datetime.UTC)
    dry = place.retain(p, now, dry_run=True)
    assert sorted(dry.kept) == sorted([*chain, timeless]) and dry.dropped == (lone,)
    assert (tmp_path / lone).exists() and (tmp_path / (lone + ".json")).exists()
    assert place.retain(p, now) == dry
    left = sorted(n + s for n in (*chain, timeless) for s in ("", ".json"))
    assert sorted(x.name for x in tmp_path.iterdir()) == left
    assert place.retain(p, now).dropped == ()  # what is left is what the policy keeps


def test_a_file_place_restores_a_chain_and_follows_no_symbolic_link(tmp_path: Path) -> None:
    """Read as an archive, a file place hands on a stream held as its own file, checked; a stream that is
    a symbolic link (to a file outside, or to a sound stream) is no stream of the place: refused, named."""
    for path in (FULL, INCR):
        identity = _identity(path)
        data = path.read_bytes()
        note = manifest(identity, size=len(data), sha256="0" * 64, commands=1, ledger="0", snapshot=path.stem)
        (tmp_path / (stream_name(identity) + ".json")).write_bytes(note)
        (tmp_path / stream_name(identity)).symlink_to(path)  # the fixture itself, through a link
    place = FilePlace(str(tmp_path))
    chain = place.chain(str(_identity(INCR)["uuid"]))
    assert [x.name for x in chain] == [stream_name(_identity(p)) for p in (FULL, INCR)]
    got = bytearray()
    with pytest.raises(e.RestoreStopped) as caught:
        place.restore(chain, got.extend)
    assert str(tmp_path / chain[0].name) in str(caught.value) and "symbolic link" in str(caught.value).lower()
    assert got == b""


def test_a_place_keeps_its_newest_whatever_the_minimum_and_refuses_a_fifo(tmp_path: Path) -> None:
    """The newest of a subvolume is the base of its client's next incremental: a service's place keeps it
    even under "no"/"no". A fifo named as a stream is no stream of the place: named, not waited on."""
    identity = _identity(FULL)
    note = manifest(identity, size=FULL.stat().st_size, sha256="0" * 64, commands=1, ledger="0",
                    snapshot="home.20261101T010000Z")  # fmt: skip
    (tmp_path / (stream_name(identity) + ".json")).write_bytes(note)
    os.mkfifo(tmp_path / stream_name(identity))
    place = FilePlace(str(tmp_path))
    now = datetime.datetime(2026, 12, 4, tzinfo=datetime.UTC)
    assert place.retain(policy("no", "no", tz=datetime.UTC), now, dry_run=True).dropped == ()
    chain = place.chain("home.20261101T010000Z")
    with pytest.raises(e.RestoreStopped, match="not a regular file"):
        place.restore(chain, lambda data: None)


def test_a_restore_of_a_place_names_its_snapshot(tmp_path: Path) -> None:
    from sendstream.stores import holding

    store, snapshot = holding(f"{tmp_path}/home.20261204T0130")
    assert isinstance(store, FilePlace) and store.place == str(tmp_path) and snapshot == "home.20261204T0130"
    for place in (f"{tmp_path}/", "/"):
        with pytest.raises(e.UsageError, match=f"^{place!r} names no snapshot: DIR/SNAPSHOT"):
            holding(place)
