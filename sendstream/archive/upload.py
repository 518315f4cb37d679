"""``send --to s3://``: a stream checked and healed as it is read, uploaded in parts that end on command boundaries.

Parts start at :data:`PART_SIZE` and double every :data:`GROWTH` parts, so
that S3's 10,000 parts reach its 5 TiB object limit (8 MiB x 1,000 x
(1 + 2 + ... + 512) = 8 TiB); a longer stream goes on in a further object
(``NAME.1``, ``NAME.2``, ...), in order. Parts upload in threads while the
next one fills, with at most :data:`IN_FLIGHT_BYTES` (or one part, when a
part is larger) in flight: the memory is that plus the part filling. Each
part carries its standard CRC-32C (:func:`standard_crc32c`) as the S3
additional checksum, which the store checks as it takes the part. Only a
whole, checked stream is completed; its manifest (:mod:`sendstream.transfer.stored`)
is written last, and a stream is archived when its manifest is. On any
failure the multipart upload is aborted, no parts left behind, unless it is
resumable (:class:`Parts`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import socket
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from .. import errors as e
from ..codec.crc import crc32c
from ..codec.encoder import encode_stream_header
from ..format.layout import COMMAND_HEADER_SIZE, STREAM_MAGIC
from ..io.framed import FramedInput, StreamSource
from ..io.retry import Retry
from ..ops.repair import Healer
from ..transfer.identity import Identity, snapshot_name, stream_identity
from ..transfer.journal import Chain, after
from ..transfer.ledger import Ledger
from ..transfer.stored import manifest, stream_name
from . import state
from .catalog import MANIFEST_SUFFIX, Entry, listing, read_manifest
from .hashing import Hasher
from .reading import Measured, measure
from .seal import Sealer, sealed_size
from .store import BucketClient, Location, answered, calling, missing

PART_SIZE = 8 << 20
GROWTH = 1000
MAX_PARTS = 10_000
MAX_OBJECT = 5 << 40
IN_FLIGHT_BYTES = 64 << 20
_PREFIX = 64 << 10  # what names the stream: its header and first command
_MASK = 0xFFFFFFFF


def standard_crc32c(data: Any) -> str:
    """The CRC-32C of ``data`` as S3 wants it (base64 of 4 bytes, big-endian).

    S3's is the standard CRC-32C, pre- and post-inverted; btrfs's starts at 0
    and is not inverted. Both are the same polynomial, so the btrfs function
    fed the inverted seed and inverted at the end gives the standard one.
    """
    return base64.b64encode((crc32c(data, _MASK) ^ _MASK).to_bytes(4, "big")).decode("ascii")


@dataclass
class _Object:
    key: str
    upload_id: str
    size: int = 0
    parts: int = 0


class Parts:
    """Whole commands in (:meth:`write`), multipart uploads out: one object after another.

    With ``key`` the upload is resumable: after each part completes (in order) its state is saved
    (:mod:`.state`) and ``saved`` hears where the parts saved end, a failure keeps the upload for the next
    run instead of aborting it, and a failed request is tried again ``retries`` times, waiting
    ``retry_delay`` seconds, doubling. With ``resume`` (an earlier run's state, :func:`continuable`) the
    stream's bytes from its offset on are written, and go on after the earlier run's parts. Parts are
    at most ``max_part`` bytes (and the command that crosses it). Once ``fenced()`` (another process
    took the upload over) no state is saved.
    """

    def __init__(
        self,
        s3: BucketClient,
        location: Location,
        *,
        part_size: int = PART_SIZE,
        max_object: int = MAX_OBJECT,
        in_flight: int = IN_FLIGHT_BYTES,
        digest: Any = None,
        ledger: Ledger | None = None,
        key: bytes | None = None,
        retries: int = 0,
        retry_delay: float = 1.0,
        notice: Callable[[str], object] = lambda text: None,
        sealer: Sealer | None = None,
        max_part: int = MAX_OBJECT,
        resume: state.UploadState | None = None,
        saved: Callable[[int], object] = lambda offset: None,
        fenced: Callable[[], bool] = lambda: False,
    ) -> None:
        self._s3 = s3
        self._fenced = fenced
        self._sealer = sealer
        self.location = location
        self._part_size = part_size
        self._max_part = max_part
        self._max_object = max_object
        self._budget = in_flight
        self._hasher = Hasher(digest, 2) if digest is not None else None  # of every part, in order
        self._ledger = ledger or Ledger()
        self._key, self._retry, self._notice, self._saved = key, Retry(retries, retry_delay), notice, saved
        self._buffer = bytearray()
        self._pool = ThreadPoolExecutor(max(1, in_flight // part_size), thread_name_prefix="sendstream-part")
        self._cond = threading.Condition()
        self._flying = 0  # bytes of parts being uploaded
        self._current: _Object | None = None
        self._recording = threading.RLock()  # the parts in flight, and the state saved as they complete
        self._flights: deque[tuple[Future[str], int, int, int, tuple[int, str] | None]] = deque()
        self._done: list[tuple[int, str, int]] = []  # completed parts of the current object: number, ETag, size
        self._mark: tuple[int, int, str] = (0, 0, "")  # where the last part completed in order ends
        self._skip_to = 0  # an earlier run uploaded the stream up to here
        self.name: str | None = None
        self.identity: Identity | None = None
        self.snapshot = ""
        self.objects: list[dict[str, Any]] = []  # completed: name and size, in order
        self.parts = 0
        self.size = 0  # shipped
        self.continued = 0  # where the stream written begins: an earlier run's parts hold what is before
        self._last = False  # the last part is shipped: no state is saved after it
        if resume is not None:
            self._continue(resume)

    def write(self, data: Any) -> None:
        """Take a stream header or whole commands (as the healer writes them); a part is cut at the first
        command boundary at or past its size."""
        view = memoryview(data).cast("B")
        pos = len(view) if view[: len(STREAM_MAGIC)] == STREAM_MAGIC else 0  # a header: never cut
        self._buffer += view[:pos]
        while len(view) - pos >= (need := self._next_part() - len(self._buffer)):
            end = pos
            while end - pos < need:
                end += COMMAND_HEADER_SIZE + int.from_bytes(view[end : end + 4], "little")
            if end > len(view):
                raise e.UsageError(f"the archive got part of a command at output offset {self.size + len(view)}")
            self._buffer += view[pos:end]
            self._ship()
            pos = end
        self._buffer += view[pos:]

    def _next_part(self) -> int:
        return min(self._part_size << (self.parts // GROWTH), self._max_part)

    @property
    def resumed(self) -> int:
        """Where an earlier run's upload was taken up (0: it was not)."""
        return self._skip_to

    def finish(self) -> None:
        """Upload what is left and complete the object(s). The state is not saved past the last part but
        one: a state always leaves the stream's end to come (a process cut before the manifest is written
        is taken up by sending the last part again, never by an empty rest)."""
        self._last = True
        if self._buffer or self.name is None:
            self._ship()
        if self._skip_to > self.size:
            raise e.ResumeError(f"the stream ends at offset {self.size}, before the {self._skip_to} bytes uploaded")
        assert self._current is not None
        self._complete(self._current)
        self._pool.shutdown()
        if self._hasher is not None:
            self._hasher.close()

    def stop(self) -> None:
        """On a failure: a resumable upload keeps what completed (its state saved); any other is aborted,
        its parts removed."""
        self._pool.shutdown(cancel_futures=not self._key)
        if self._hasher is not None:
            self._hasher.close(cancel=True)
        if self._current is None:
            return
        if self._key:
            with contextlib.suppress(Exception):
                self._record(wait=True)
            return
        with calling(self.location.url(self._current.key)):
            self._s3.abort_multipart_upload(
                Bucket=self.location.bucket, Key=self.location.key(self._current.key), UploadId=self._current.upload_id
            )
        self._current = None

    def forget(self) -> None:
        """The stream is archived: its upload state goes."""
        if self._key and self.name:
            self.call(
                self.name + state.STATE_SUFFIX,
                self._s3.delete_object,
                Key=self.location.key(self.name + state.STATE_SUFFIX),
            )

    def _ship(self) -> None:
        part, self._buffer = self._buffer, bytearray()
        if self.name is None:
            self._named(bytes(part[:_PREFIX]))
        end = self.size + len(part)
        if end <= self._skip_to:  # an earlier run uploaded it: only hashed again
            self._hash(part)
            self.parts += 1
            self.size = end
            return
        stored = sealed_size(len(part)) if self._sealer else len(part)
        if self.size < self._skip_to:
            raise e.ResumeError(
                f"this run cuts a part at offset {end}, the earlier run at {self._skip_to}: "
                "the stream or the part size differs from the earlier run's"
            )
        current = self._current
        assert self.name is not None
        if current is None or current.parts == MAX_PARTS or current.size + stored > self._max_object:
            if current is not None:
                self._complete(current)
            current = self._current = self._begin(self.name + (f".{len(self.objects)}" if self.objects else ""))
        self._hash(part)
        current.parts += 1
        current.size += stored
        self.parts += 1
        self.size = end
        # (computed now: the ledger is at this write; a continued stream's ledger is not known before the end)
        mark = ((0, "") if self.continued else self._ledger.at(end)) if self._key else None
        self._record()  # the parts done go, so that only those in flight are looked at
        self._raise_failed()
        with self._cond:
            while self._flying and self._flying + len(part) > self._budget:
                self._cond.wait()
            self._flying += len(part)
        future = self._pool.submit(self._upload, current, current.parts, self.parts, part)
        with self._recording:
            self._flights.append((future, current.parts, stored, end, mark))
        if self._key:
            future.add_done_callback(lambda _: self._record())  # the state follows each part as it completes

    def _raise_failed(self) -> None:
        with self._recording:
            failed = next((f for f, *_ in self._flights if f.done() and f.exception() is not None), None)
        if failed is not None:
            failed.result()

    def _hash(self, part: bytearray) -> None:
        if self._hasher is not None:
            self._hasher.update(part)

    def _named(self, prefix: bytes) -> None:
        """The stream says what it is: name it, refuse it when archived, take up an earlier run's upload."""
        self.identity = stream_identity(prefix)
        self.snapshot = snapshot_name(prefix)
        self.name = stream_name(self.identity)
        _refuse_archived(self._s3, self.location, self.name)
        if self._key and (earlier := state.load(self._s3, self.location, self.name, self._key)) is not None:
            earlier.refuse_other_sealing(self._sealer.description if self._sealer else None, self.location, self.name)
            self._take_up(earlier)

    def _take_up(self, earlier: state.UploadState) -> None:
        if not continuable(self._s3, self.location, earlier, self._notice):
            return
        self._skip_to = earlier.offset
        if earlier.offset:
            self._ledger.expect(earlier.checkpoint, "the earlier upload's")
        self.objects = list(earlier.objects)
        self._done = list(earlier.parts)
        self._mark = (earlier.offset, earlier.commands, earlier.ledger)
        size = sum(size for _, _, size in earlier.parts)
        self._current = _Object(earlier.key, earlier.upload_id, size, len(earlier.parts))
        self._notice(f"taking up the upload an earlier run began: {earlier.offset} bytes are there")

    def _continue(self, earlier: state.UploadState) -> None:
        """Go on after ``earlier``'s parts with the stream's bytes from its offset (they are not read again)."""
        self.identity, self.name = earlier.stream, stream_name(earlier.stream)
        self.objects, self._done = list(earlier.objects), list(earlier.parts)
        self._mark = (earlier.offset, earlier.commands, earlier.ledger)
        self.size = self.continued = earlier.offset
        # parts of at most max_part fill each object to MAX_PARTS: the count, for their growth
        self.parts = MAX_PARTS * len(earlier.objects) + len(earlier.parts)
        size = sum(size for _, _, size in earlier.parts)
        self._current = _Object(earlier.key, earlier.upload_id, size, len(earlier.parts))

    def _upload(self, obj: _Object, number: int, index: int, part: bytearray) -> str:
        size = len(part)
        body: Any = part
        try:
            if self._sealer is not None:
                assert self.name is not None
                body = self._sealer.seal(part, self.name, index)
            answer = self.call(
                f"{obj.key} part {number}",
                self._s3.upload_part,
                Key=self.location.key(obj.key),
                UploadId=obj.upload_id,
                PartNumber=number,
                Body=body,
                ChecksumCRC32C=standard_crc32c(body),
            )
            return str(answered(answer, "ETag", self.location.url(f"{obj.key} part {number}")))
        finally:
            with self._cond:
                self._flying -= size
                self._cond.notify_all()

    def _record(self, wait: bool = False) -> None:
        """Take the parts completed in order (all of them, ``wait``ing); a resumable upload saves its state.
        A part that failed raises its error here (when ``wait``ing, or in the thread that shipped it)."""
        with self._recording:
            moved = False
            while self._flights:
                future = self._flights[0][0]
                if not wait and not (future.done() and future.exception() is None):
                    break
                future, number, size, end, mark = self._flights.popleft()
                self._done.append((number, future.result(), size))
                if mark is not None:
                    self._mark = (end, *mark)
                moved = True
            if moved and self._key:
                self._save()

    def _save(self) -> None:
        if self._fenced() or self._last:  # another process holds the upload now; or the last part is going
            return
        assert self._current is not None and self.identity is not None and self.name is not None and self._key
        offset, commands, ledger = self._mark
        now = state.UploadState(
            self.identity,
            self._current.upload_id,
            self._current.key,
            self.objects,
            self._done,
            offset,
            commands,
            ledger,
            self._sealer.description if self._sealer else None,
        )
        key = self._key
        self._retrying(lambda: state.save(self._s3, self.location, self.name or "", now, key))
        self._saved(offset)

    def call(self, name: str, method: Callable[..., Any], **arguments: Any) -> Any:
        """``method`` of the store on ``name`` (under the prefix), tried again when it may work later."""

        def once() -> Any:
            with calling(self.location.url(name)):
                return method(Bucket=self.location.bucket, **arguments)

        return self._retrying(once)

    def _retrying(self, request: Callable[[], Any]) -> Any:
        """``request()``, tried again ``retries`` times (waiting, doubling) while its error may pass."""
        return self._retry.call(request, lambda exc: isinstance(exc, e.StoreError) and exc.retryable, self._notice)

    def _begin(self, name: str) -> _Object:
        answer = self.call(name, self._s3.create_multipart_upload, Key=self.location.key(name))
        self._done = []
        obj = _Object(name, answered(answer, "UploadId", self.location.url(name)))
        if self._key:
            self._current = obj
            self._save()
        return obj

    def _complete(self, obj: _Object) -> None:
        self._record(wait=True)
        parts = [{"PartNumber": number, "ETag": etag} for number, etag, _ in self._done]
        self.call(
            obj.key,
            self._s3.complete_multipart_upload,
            Key=self.location.key(obj.key),
            UploadId=obj.upload_id,
            MultipartUpload={"Parts": parts},
        )
        done = {"key": obj.key, "size": obj.size}
        if self._sealer is not None:
            done["parts"] = [size for _, _, size in self._done]  # where each sealed part is
        self.objects.append(done)
        self._current = None


def continuable(
    s3: BucketClient, location: Location, earlier: state.UploadState, notice: Callable[[str], object]
) -> bool:
    """Whether the store still holds the multipart upload ``earlier`` names with every part it names
    (``notice`` hears why not)."""
    listed: dict[int, int] = {}
    try:
        with calling(location.url(earlier.key)):
            pages = s3.get_paginator("list_parts").paginate(
                Bucket=location.bucket, Key=location.key(earlier.key), UploadId=earlier.upload_id
            )
            listed = {p.get("PartNumber"): p.get("Size") for page in pages for p in page.get("Parts", [])}
    except e.StoreError as exc:
        if not missing(exc):
            raise
        notice(f"the upload an earlier run began is gone from the store ({exc.reason}); starting over")
        return False
    if any(listed.get(number) != size for number, _, size in earlier.parts):
        notice("the store lacks parts the earlier run's state names; starting over")
        return False
    return True


def _refuse_archived(s3: BucketClient, location: Location, name: str) -> None:
    url = location.url(name + ".json")
    try:
        with calling(url):
            s3.head_object(Bucket=location.bucket, Key=location.key(name + ".json"))
    except e.StoreError as exc:
        if missing(exc):
            return
        raise
    raise e.UsageError(f"{url}: this stream is archived already (its manifest is there)")


def hold_sealing(s3: BucketClient, location: Location, sealer: Sealer | None) -> None:
    """Refuse to archive a stream at ``location`` sealed otherwise (with another key, or none) than the
    newest stream archived there: a prefix's streams are all sealed with one key, or all plain."""
    newest = _newest(s3, location)
    if newest is None or newest.sealed == (sealer.fingerprint if sealer else ""):
        return
    url, theirs = location.url(), f"sealed with key {newest.sealed}" if newest.sealed else "not encrypted"
    if sealer is None:
        mine, fix = "this one would not be", "give --encrypt-key FILE of that key"
    else:
        mine = f"this one would be sealed with key {sealer.fingerprint}"
        fix = "give --encrypt-key FILE of that key" if newest.sealed else "leave out --encrypt-key"
    raise e.UsageError(
        f"{url}: its streams are {theirs} (the newest: {newest.name}), {mine}: {fix}, "
        "or --change-sealing to archive it so all the same (and its later streams with it)"
    )


def _newest(s3: BucketClient, location: Location) -> Entry | None:
    """The stream archived at ``location`` whose manifest was written last (a manifest that cannot be taken
    is passed over)."""
    manifests = sorted((when, name) for name, when in listing(s3, location) if name.endswith(MANIFEST_SUFFIX))
    for _, name in reversed(manifests):
        try:
            return read_manifest(s3, location, name)
        except e.BadManifest:
            continue
        except e.StoreError as exc:
            if not missing(exc):
                raise
    return None


@dataclass
class Archived:
    """What ``send --to s3://`` stored: the stream's name, its objects, and what its manifest says."""

    url: str
    objects: list[dict[str, Any]]
    size: int
    commands: int
    restarts: int
    snapshot: str
    resumed: int  # bytes an earlier run had uploaded


def upload(
    source: StreamSource,
    location: Location,
    s3: BucketClient,
    *,
    max_command_size: int | None = None,
    warn: Any = None,
    part_size: int = PART_SIZE,
    max_object: int = MAX_OBJECT,
    wrote: Callable[[int], object] | None = None,
    key: bytes | None = None,
    retries: int = 0,
    retry_delay: float = 1.0,
    notice: Callable[[str], object] = lambda text: None,
    sealer: Sealer | None = None,
    change_sealing: bool = False,
    in_flight: int = IN_FLIGHT_BYTES,
    max_part: int = MAX_OBJECT,
    resume: state.UploadState | None = None,
    saved: Callable[[int], object] = lambda offset: None,
    fenced: Callable[[], bool] = lambda: False,
    **origin: Any,
) -> Archived:
    """Check and heal ``source`` and archive the clean stream at ``location``, named by what it is,
    with its manifest beside it (``origin``: where it came from; this host by default). ``wrote``
    hears the size of every write taken (a session acknowledges what is taken).

    With ``key`` the upload is resumable (:class:`Parts`): run again with the same stream, it takes up
    where the earlier run's last part completed, checking the stream against the ledger there. With
    ``sealer`` every part is encrypted and authenticated before it leaves (:class:`~.seal.Sealer`); it
    must seal as the newest stream at ``location`` was sealed (:func:`hold_sealing`), unless
    ``change_sealing``. ``in_flight`` bytes of parts upload at once, each at most ``max_part``.

    With ``resume`` (an earlier run's state, :func:`continuable`; not sealed), ``source`` gives the stream
    from the state's offset on: a session that continues a transfer another process began. What the
    stream is (size, commands, ledger, SHA-256: all its bytes) is then known only from the store: once
    complete, the stream is read back from it (every command checked again) for its manifest.
    """
    if not change_sealing:
        hold_sealing(s3, location, sealer)
    ledger, digest = Ledger(), hashlib.sha256()
    parts = Parts(
        s3, location, part_size=part_size, max_object=max_object, digest=digest, ledger=ledger,
        key=key, retries=retries, retry_delay=retry_delay, notice=notice, sealer=sealer,
        in_flight=in_flight, max_part=max_part, resume=resume, saved=saved, fenced=fenced,
    )  # fmt: skip
    write = parts.write if wrote is None else _counted(parts.write, wrote)
    if resume is not None:
        assert sealer is None
        header = encode_stream_header(resume.stream["version"] or 1)  # the framer begins at a stream header
        source, write = cast(BinaryIO, Chain(io.BytesIO(header), source)), after(len(header), write)
    try:
        with FramedInput(source, max_command_size=max_command_size, warn=warn, skip=(e.StreamRestarted,)) as stream:
            healer = Healer(write, ledger=ledger)
            for event in stream.events(healer.batch):
                healer.event(event)
        parts.finish()
    except BaseException:
        parts.stop()
        raise
    assert parts.name is not None and parts.identity is not None
    if resume is None:
        found = Measured(healer.written, 0, ledger.commands, ledger.digest(), digest.hexdigest())
    else:
        begun = bytearray()  # the stream's first bytes, read back: they say the snapshot

        def head(data: Any) -> None:
            if len(begun) < _PREFIX:
                begun.extend(memoryview(data)[: _PREFIX - len(begun)])

        found = measure(s3, location, _entry(parts.name, parts.identity, parts.objects), head)
        parts.snapshot = snapshot_name(bytes(begun))
    record = manifest(
        parts.identity,
        size=found.size,
        sha256=found.sha256,
        commands=found.commands,
        ledger=found.ledger,
        objects=parts.objects,
        # sealed: the content is not readable without the key, and neither is the snapshot's name
        **({"encryption": sealer.description} if sealer else {"snapshot": parts.snapshot}),
        **(origin or {"host": socket.gethostname()}),
    )
    parts.call(parts.name + ".json", s3.put_object, Key=location.key(parts.name + ".json"), Body=record)
    parts.forget()
    return Archived(
        location.url(parts.name), parts.objects, found.size, found.commands, healer.restart_count,
        parts.snapshot, parts.resumed or parts.continued,
    )  # fmt: skip


def archived_as(
    s3: BucketClient, location: Location, name: str, source: StreamSource, wrote: Callable[[int], object]
) -> Entry | None:
    """The manifest of ``name`` when it is archived at ``location`` already, and the stream of ``source``
    (checked and healed as :func:`upload` takes it; ``wrote`` hears the size of each write) is that same
    stream (size, ledger, SHA-256); a :class:`~sendstream.errors.UsageError` when it is another of that
    name. None when none is archived (nothing of ``source`` is read then)."""
    try:
        entry = read_manifest(s3, location, name + ".json")
    except e.StoreError as exc:
        if missing(exc):
            return None
        raise
    ledger, digest = Ledger(), hashlib.sha256()
    with FramedInput(source, skip=(e.StreamRestarted,)) as stream:
        healer = Healer(_counted(digest.update, wrote), ledger=ledger)
        for event in stream.events(healer.batch):
            healer.event(event)
    if (healer.written, ledger.digest(), digest.hexdigest()) != (entry.size, entry.ledger, entry.sha256):
        raise e.UsageError(f"{location.url(name)}: another stream of this name is archived already: refused")
    return entry


def _entry(name: str, identity: Identity, objects: list[dict[str, Any]]) -> Entry:
    """What reading a stream just completed needs of a manifest (it has none yet): its name and objects."""
    parent = identity["parent_uuid"]
    return Entry(
        name, str(identity["uuid"]), int(identity["ctransid"] or 0),
        (parent, int(identity["parent_ctransid"] or 0)) if parent else None,
        "", 0, "", "", 0, "", tuple((o["key"], o["size"]) for o in objects),
    )  # fmt: skip


def _counted(write: Callable[[Any], object], wrote: Callable[[int], object]) -> Callable[[Any], None]:
    def counted(data: Any) -> None:
        write(data)
        wrote(len(data))

    return counted
