"""``send --to s3://``: a stream checked and healed as it is read, uploaded in parts that end on command boundaries.

Parts start at :data:`PART_SIZE` and double every :data:`GROWTH` parts, so
that S3's 10,000 parts reach its 5 TiB object limit (8 MiB x 1,000 x
(1 + 2 + ... + 512) = 8 TiB); a longer stream goes on in a further object
(``NAME.1``, ``NAME.2``, ...), in order. Parts upload in threads while the
next one fills, with at most :data:`IN_FLIGHT_BYTES` (or one part, when a
part is larger) in flight: the memory is that plus the part filling. Each
part carries its standard CRC-32C (:func:`standard_crc32c`) as the S3
additional checksum, which the store checks as it takes the part. Only a
whole, checked stream is completed; its manifest (:mod:`sendstream.ops.stored`)
is written last, and a stream is archived when its manifest is. On any
failure the multipart upload is aborted: no parts are left behind.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import errors as e
from ..codec.crc import crc32c
from ..format.layout import COMMAND_HEADER_SIZE, STREAM_MAGIC
from ..io.framed import FramedInput, StreamSource
from ..ops.identity import first_command, stream_identity
from ..ops.ledger import Ledger
from ..ops.repair import Healer
from ..ops.stored import manifest, stream_name
from .store import Location, calling, missing

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
    """Whole commands in (:meth:`write`), multipart uploads out: one object after another."""

    def __init__(
        self,
        s3: Any,
        location: Location,
        *,
        part_size: int = PART_SIZE,
        max_object: int = MAX_OBJECT,
        in_flight: int = IN_FLIGHT_BYTES,
        digest: Any = None,
    ) -> None:
        self._s3 = s3
        self._digest = digest  # of every part, in order, in a thread of its own (beside the checks)
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="sendstream-hash")
        self._hashing: deque[Future[None]] = deque()
        self.location = location
        self._part_size = part_size
        self._max_object = max_object
        self._budget = in_flight
        self._buffer = bytearray()
        self._pool = ThreadPoolExecutor(max(1, in_flight // part_size), thread_name_prefix="sendstream-part")
        self._cond = threading.Condition()
        self._flying = 0  # bytes of parts being uploaded
        self._failed: BaseException | None = None
        self._current: _Object | None = None
        self._futures: list[Future[dict[str, Any]]] = []
        self.name: str | None = None
        self.identity: dict[str, Any] | None = None
        self.snapshot = ""
        self.objects: list[dict[str, Any]] = []  # completed: key and size, in order
        self.parts = 0
        self.size = 0  # shipped

    def write(self, data: Any) -> None:
        """Take a stream header or whole commands (as the healer writes them); a part is cut at the first
        command boundary at or past its size."""
        view = memoryview(data).cast("B")
        pos = len(view) if view[: len(STREAM_MAGIC)] == STREAM_MAGIC else 0  # a header: never cut
        self._buffer += view[:pos]
        while len(view) - pos >= (need := (self._part_size << (self.parts // GROWTH)) - len(self._buffer)):
            end = pos
            while end - pos < need:
                end += COMMAND_HEADER_SIZE + int.from_bytes(view[end : end + 4], "little")
            if end > len(view):
                raise e.UsageError(f"the archive got part of a command at output offset {self.size + len(view)}")
            self._buffer += view[pos:end]
            self._ship()
            pos = end
        self._buffer += view[pos:]

    def finish(self) -> None:
        """Upload what is left and complete the object(s)."""
        if self._buffer or self.name is None:
            self._ship()
        assert self._current is not None
        self._complete(self._current)
        self._pool.shutdown()
        self._hasher.shutdown()

    def abort(self) -> None:
        """Stop: the upload of the current object is aborted, its parts removed."""
        self._pool.shutdown(cancel_futures=True)
        self._hasher.shutdown(cancel_futures=True)
        if self._current is not None:
            with calling(self.location.url(self._current.key)):
                self._s3.abort_multipart_upload(
                    Bucket=self.location.bucket, Key=self._current.key, UploadId=self._current.upload_id
                )
            self._current = None

    def _ship(self) -> None:
        part, self._buffer = self._buffer, bytearray()
        if self.name is None:
            prefix = bytes(part[:_PREFIX])
            self.identity = stream_identity(prefix)
            first = first_command(prefix)[1]
            self.snapshot = os.fsdecode(first.get("path", b"")) if first is not None else ""
            self.name = stream_name(self.identity)
            self._refuse_archived()
        current = self._current
        if current is None or current.parts == MAX_PARTS or current.size + len(part) > self._max_object:
            if current is not None:
                self._complete(current)
            current = self._current = self._begin(self.name + (f".{len(self.objects)}" if self.objects else ""))
        if self._digest is not None:
            while len(self._hashing) > 1:
                self._hashing.popleft().result()
            self._hashing.append(self._hasher.submit(self._digest.update, part))
        current.parts += 1
        current.size += len(part)
        self.parts += 1
        self.size += len(part)
        with self._cond:
            while self._flying and self._flying + len(part) > self._budget and self._failed is None:
                self._cond.wait()
            if self._failed is not None:
                raise self._failed
            self._flying += len(part)
        self._futures.append(self._pool.submit(self._upload, current, current.parts, part))

    def _upload(self, obj: _Object, number: int, part: bytearray) -> dict[str, Any]:
        try:
            checksum = standard_crc32c(part)
            with calling(self.location.url(obj.key) + f" part {number}"):
                answer = self._s3.upload_part(
                    Bucket=self.location.bucket,
                    Key=obj.key,
                    UploadId=obj.upload_id,
                    PartNumber=number,
                    Body=part,
                    ChecksumCRC32C=checksum,
                )
            return {"PartNumber": number, "ETag": answer["ETag"]}
        except BaseException as exc:
            with self._cond:
                self._failed = self._failed or exc
            raise
        finally:
            with self._cond:
                self._flying -= len(part)
                self._cond.notify_all()

    def _begin(self, name: str) -> _Object:
        key = self.location.key(name)
        with calling(self.location.url(name)):
            answer = self._s3.create_multipart_upload(Bucket=self.location.bucket, Key=key)
        self._futures = []
        return _Object(key, answer["UploadId"])

    def _complete(self, obj: _Object) -> None:
        parts = [future.result() for future in self._futures]
        with calling(self.location.url(obj.key)):
            self._s3.complete_multipart_upload(
                Bucket=self.location.bucket, Key=obj.key, UploadId=obj.upload_id, MultipartUpload={"Parts": parts}
            )
        self.objects.append({"key": obj.key[len(self.location.prefix) :], "size": obj.size})
        self._current = None

    def _refuse_archived(self) -> None:
        assert self.name is not None
        url = self.location.url(self.name + ".json")
        try:
            with calling(url):
                self._s3.head_object(Bucket=self.location.bucket, Key=self.location.key(self.name + ".json"))
        except e.StoreError as exc:
            if missing(exc):
                return
            raise
        raise e.UsageError(f"{url}: this stream is archived already (its manifest is there)")


@dataclass
class Archived:
    """What ``send --to s3://`` stored: the stream's name, its objects, and what its manifest says."""

    url: str
    objects: list[dict[str, Any]]
    size: int
    commands: int
    restarts: int
    snapshot: str


def upload(
    source: StreamSource,
    location: Location,
    s3: Any,
    *,
    max_command_size: int | None = None,
    warn: Any = None,
    part_size: int = PART_SIZE,
    max_object: int = MAX_OBJECT,
    wrote: Callable[[int], object] | None = None,
    **origin: Any,
) -> Archived:
    """Check and heal ``source`` and archive the clean stream at ``location``, named by what it is,
    with its manifest beside it (``origin``: where it came from; this host by default). ``wrote``
    hears the size of every write taken (a session acknowledges what is taken)."""
    ledger, digest = Ledger(), hashlib.sha256()
    parts = Parts(s3, location, part_size=part_size, max_object=max_object, digest=digest)
    try:
        with FramedInput(source, max_command_size=max_command_size, warn=warn, skip=(e.StreamRestarted,)) as stream:
            healer = Healer(parts.write if wrote is None else _counted(parts.write, wrote), ledger=ledger)
            for event in stream.events(healer.batch):
                healer.event(event)
        parts.finish()
    except BaseException:
        parts.abort()
        raise
    assert parts.name is not None and parts.identity is not None
    record = manifest(
        parts.identity,
        size=healer.written,
        sha256=digest.hexdigest(),
        commands=ledger.commands,
        ledger=ledger.digest(),
        snapshot=parts.snapshot,
        objects=parts.objects,
        **(origin or {"host": socket.gethostname()}),
    )
    with calling(location.url(parts.name + ".json")):
        s3.put_object(Bucket=location.bucket, Key=location.key(parts.name + ".json"), Body=record)
    return Archived(
        location.url(parts.name), parts.objects, healer.written, ledger.commands, healer.restart_count, parts.snapshot
    )


def _counted(write: Callable[[Any], object], wrote: Callable[[int], object]) -> Callable[[Any], None]:
    def counted(data: Any) -> None:
        write(data)
        wrote(len(data))

    return counted
