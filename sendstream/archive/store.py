"""Where an archive lives (``s3://BUCKET/PREFIX``) and the client that reaches it.

Credentials and the endpoint come the way the AWS tools find them (boto3's
chain: ``AWS_ACCESS_KEY_ID`` and the other environment variables, the
config and credentials files, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``), or
``--endpoint-url``; so AWS S3, MinIO, Ceph RGW and SeaweedFS all work.
Every failure of the store becomes a :class:`~sendstream.errors.StoreError`
that names the object.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import io
import os
import re
import stat
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from traceback import walk_tb
from typing import Any, Literal, Protocol

from .. import errors as e
from ..transfer.identity import printable

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_LATER = {"SlowDown", "RequestTimeout", "ServiceUnavailable", "InternalError", "ThrottlingException"}
POOL = 16  # connections kept per client: the parts in flight, and readers ahead

Answer = dict[str, Any]  # what botocore made of a store's answer: its fields, as the S3 API names them


class Pages(Protocol):
    """A paginator of the client: the pages of one listing."""

    def paginate(self, *, Bucket: str, **arguments: str) -> Iterable[Answer]: ...


class BucketClient(Protocol):
    """The calls of an S3 client the archive makes (boto3's client has them; so may a test's own)."""

    def get_object(self, *, Bucket: str, Key: str, Range: str = ...) -> Answer: ...
    def head_object(self, *, Bucket: str, Key: str) -> Answer: ...
    def put_object(
        self, *, Bucket: str, Key: str, Body: bytes, IfNoneMatch: str = ..., IfMatch: str = ...
    ) -> Answer: ...
    def delete_object(self, *, Bucket: str, Key: str, IfMatch: str = ...) -> Answer: ...
    def delete_objects(self, *, Bucket: str, Delete: dict[str, object]) -> Answer: ...
    def create_multipart_upload(self, *, Bucket: str, Key: str) -> Answer: ...
    def upload_part(
        self, *, Bucket: str, Key: str, UploadId: str, PartNumber: int, Body: bytes | bytearray, ChecksumCRC32C: str
    ) -> Answer: ...
    def complete_multipart_upload(
        self, *, Bucket: str, Key: str, UploadId: str, MultipartUpload: dict[str, list[dict[str, object]]]
    ) -> Answer: ...
    def abort_multipart_upload(self, *, Bucket: str, Key: str, UploadId: str) -> Answer: ...
    def get_paginator(self, operation: Literal["list_objects_v2", "list_parts"]) -> Pages: ...


@dataclass(frozen=True)
class Location:
    """A bucket, and a prefix in it ("" or ending in ``/``)."""

    bucket: str
    prefix: str = ""
    one_file = False  # whether a stream is one object of its name, which its manifest does not list

    @classmethod
    def parse(cls, url: str) -> Location:
        """``s3://BUCKET`` or ``s3://BUCKET/PREFIX``."""
        if not url.startswith("s3://"):
            raise e.UsageError(f"{url!r} is not an s3://BUCKET/PREFIX address")
        bucket, _, prefix = url[5:].partition("/")
        if not _BUCKET.match(bucket):
            raise e.UsageError(f"{url!r}: {bucket!r} is not a bucket name (3-63 of a-z, 0-9, '.', '-')")
        prefix = prefix.strip("/")
        return cls(bucket, prefix + "/" if prefix else "")

    def key(self, name: str) -> str:
        return self.prefix + name

    def url(self, name: str = "") -> str:
        return f"s3://{self.bucket}/{self.key(name)}"

    def last(self) -> tuple[Location, str]:
        """This location's parent, and its last component (``s3://b/p/NAME``: ``s3://b/p``, ``NAME``)."""
        head, _, tail = self.prefix.rstrip("/").rpartition("/")
        return Location(self.bucket, head + "/" if head else ""), tail

    def connect(self, endpoint_url: str | None = None) -> BucketClient:
        """A client that reaches this location (a process of a pool makes its own)."""
        return connect(endpoint_url)


@dataclass(frozen=True)
class Directory(Location):
    """A directory of streams and their manifests (a service's file place), read and pruned as an archive:
    ``bucket`` is its path, the prefix empty, and what is said of an object names its file."""

    one_file = True

    def url(self, name: str = "") -> str:
        return os.path.join(self.bucket, name) if name else self.bucket

    def connect(self, endpoint_url: str | None = None) -> BucketClient:
        return DirectoryClient()


class DirectoryClient:
    """The calls of :class:`BucketClient` that reading, listing and pruning make, on the files of a directory
    (``Bucket``: its path; ``Key``: a file's name in it); what a directory cannot do (take an upload) is a
    usage error. Hidden files (a transfer's journal, a manifest being written) are not listed."""

    _PAGE = 1000

    def get_object(self, *, Bucket: str, Key: str, Range: str = "") -> Answer:
        path = os.path.join(Bucket, Key)
        start, _, end = Range.removeprefix("bytes=").partition("-")
        try:  # a symbolic link, a fifo or a device in a place is nobody's stream (no file outside is read)
            with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    raise e.StoreError(path, "not a regular file: no stream of the place")
                f.seek(int(start or 0))
                data = f.read(int(end) - int(start or 0) + 1 if end else -1)
        except OSError as exc:
            code = "NoSuchKey" if exc.errno == errno.ENOENT else "cannot read"
            raise e.StoreError(path, f"{code}: {exc.strerror}") from None
        return {"Body": io.BytesIO(data), "ContentLength": len(data)}

    def get_paginator(self, operation: Literal["list_objects_v2", "list_parts"]) -> Pages:
        return self

    def paginate(self, *, Bucket: str, **arguments: str) -> Iterator[Answer]:
        """The regular files of the directory, a page at a time as they are read (the caller bounds how many
        it takes); one deleted while it is listed is left out."""
        page: list[Answer] = []
        try:
            with os.scandir(Bucket) as found:
                for entry in found:
                    try:
                        if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                            continue
                        when = entry.stat(follow_symlinks=False).st_mtime
                    except FileNotFoundError:
                        continue
                    page.append({"Key": entry.name, "LastModified": _utc(when)})
                    if len(page) == self._PAGE:
                        yield {"Contents": page}
                        page = []
        except OSError as exc:
            raise e.StoreError(Bucket, f"cannot be listed: {exc.strerror}") from None
        yield {"Contents": page}

    def delete_objects(self, *, Bucket: str, Delete: dict[str, object]) -> Answer:
        for item in Delete["Objects"]:  # type: ignore[attr-defined]
            path = os.path.join(Bucket, item["Key"])
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue  # gone already: as a store says nothing of a key that is not there
            except OSError as exc:
                raise e.StoreError(path, f"not deleted: {exc.strerror}") from None
        return {}

    def _cannot(self, **_: object) -> Answer:
        raise e.UsageError("a file place takes streams from a session (sendstream serve), not uploads")

    head_object = put_object = delete_object = create_multipart_upload = upload_part = _cannot
    complete_multipart_upload = abort_multipart_upload = _cannot


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC)


def connect(endpoint_url: str | None = None) -> BucketClient:
    """An S3 client from boto3's chain of credentials and endpoints (``endpoint_url`` first, if given)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise e.UsageError("s3:// needs boto3: pip install 'sendstream[s3]'") from None
    if endpoint_url is not None:
        _check_endpoint(endpoint_url)
    config = Config(max_pool_connections=POOL, retries={"max_attempts": 5, "mode": "standard"})
    with calling("s3://"):
        try:
            client: BucketClient = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
            return client
        except ValueError as exc:  # botocore's word on an endpoint, ours or one from AWS_ENDPOINT_URL or ~/.aws
            given = (
                f"--endpoint-url {endpoint_url!r}"
                if endpoint_url
                else "the S3 endpoint of AWS_ENDPOINT_URL or the AWS config"
            )
            raise e.UsageError(f"{given}: {exc}") from None


def _check_endpoint(url: str) -> None:
    """``--endpoint-url``: ``http(s)://HOST[:PORT][/PATH]``, or a one-line error naming it."""
    try:
        parts = urllib.parse.urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # an unclosed '[', a port out of range or not a number
        ok = False
    if not ok:
        raise e.UsageError(
            f"--endpoint-url {url!r}: expected http:// or https://, a host and maybe a port "
            "(http://127.0.0.1:8333, https://[::1]:9000)"
        )


@contextlib.contextmanager
def calling(where: str) -> Iterator[None]:
    """Turn what the S3 client raises into a :class:`~sendstream.errors.StoreError` naming ``where``."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError
    except ImportError:  # no S3 client here: a directory's client raises our own errors
        yield
        return
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "?"), error.get("Message", "")
        said = f" ({_said(message)})" if message else ""
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        retryable = status >= 500 or code in _LATER
        raise e.StoreError(where, f"{exc.operation_name} failed: {_said(code)}{said}", retryable) from None
    except BotoCoreError as exc:
        raise e.StoreError(where, _said(exc), isinstance(exc, ConnectionError | HTTPClientError)) from None
    except Exception as exc:  # botocore's parser on an answer it cannot read: int("x"), an element twice, ...
        if not _raised_in_botocore(exc):
            raise
        raise e.StoreError(where, f"its answer cannot be read: {_said(f'{type(exc).__name__}: {exc}')}") from None


def _raised_in_botocore(exc: BaseException) -> bool:
    return any(frame.f_globals.get("__name__", "").startswith("botocore.") for frame, _ in walk_tb(exc.__traceback__))


def _said(what: object) -> str:
    """What a store said, for a message of one line: escaped (it must not drive a terminal), cut short."""
    text = printable(str(what))
    return text if len(text) <= 200 else text[:200] + "..."


def answered(answer: Any, field: str, where: str) -> Any:
    """``field`` of a store's ``answer`` (what botocore made of it); a StoreError naming ``where`` when the
    store left it out (an UploadId, an ETag)."""
    value = answer.get(field) if isinstance(answer, dict) else None
    if value is None or value == "":
        raise e.StoreError(where, f"its answer has no {field}")
    return value


def missing(exc: BaseException) -> bool:
    """Whether a store error says the object or key is not there."""
    return isinstance(exc, e.StoreError) and any(
        code in exc.reason for code in ("NoSuchKey", "404", "Not Found", "NoSuchUpload")
    )
