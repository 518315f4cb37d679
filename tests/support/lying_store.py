"""A store that lies: a small S3 of the test's own, enough for ``archive ls``, ``restore`` and ``verify``.

It answers ListObjectsV2 (S3's XML, with continuation tokens) and GetObject, with or without honouring
Range, from what the test puts in :attr:`LyingStore.objects`: bytes, or a :class:`Pattern` made as it
is sent (so that a 512 MiB object costs the test nothing). :attr:`LyingStore.endless` makes the
listing go on for ever, a page of new keys after another. Any access key works, as with SeaweedFS.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape

PAGE = 1000  # keys a page, as S3's


@dataclass(frozen=True)
class Pattern:
    """``size`` bytes of ``block`` over and over."""

    size: int
    block: bytes

    def span(self, start: int, end: int) -> Iterator[bytes]:
        at = start
        while at < end:
            offset = at % len(self.block)
            piece = self.block[offset : offset + min(end - at, len(self.block) - offset)]
            yield piece
            at += len(piece)


@dataclass
class LyingStore:
    endpoint: str
    bucket: str = "liar"
    objects: dict[str, bytes | Pattern] = field(default_factory=dict)
    honour_range: bool = True
    endless: str | None = None  # the listing never ends: pages of keys NNNNNNNN + this suffix
    pages: int = 0  # listing pages answered

    def env(self) -> dict[str, str]:
        """The environment of a process of ours that reaches this store (and no other)."""
        return dict(
            os.environ,
            AWS_ACCESS_KEY_ID="test",
            AWS_SECRET_ACCESS_KEY="test",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=self.endpoint,
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        )


def _listing(store: LyingStore, query: dict[str, str]) -> bytes:
    prefix, token = query.get("prefix", ""), int(query.get("continuation-token", "0"))
    store.pages += 1
    if store.endless is not None:
        keys = [(f"{prefix}{n:08d}{store.endless}", 1) for n in range(token, token + PAGE)]
        more = True
    else:
        listed = sorted((k, _size(v)) for k, v in store.objects.items() if k.startswith(prefix))
        keys, more = listed[token : token + PAGE], token + PAGE < len(listed)
    contents = "".join(
        f"<Contents><Key>{escape(k)}</Key><LastModified>2026-12-01T00:00:{n % 60:02d}.000Z</LastModified>"
        f'<ETag>"0"</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>'
        for n, (k, size) in enumerate(keys)
    )
    following = f"<NextContinuationToken>{token + PAGE}</NextContinuationToken>" if more else ""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{store.bucket}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(keys)}</KeyCount>"
        f"<MaxKeys>{PAGE}</MaxKeys><IsTruncated>{'true' if more else 'false'}</IsTruncated>"
        f"{following}{contents}</ListBucketResult>"
    ).encode()


def _size(value: bytes | Pattern) -> int:
    return value.size if isinstance(value, Pattern) else len(value)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store: LyingStore

    def log_message(self, format: str, *args: object) -> None:  # (the base class's names)
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        bucket, _, key = urllib.parse.unquote(url.path).lstrip("/").partition("/")
        if bucket != self.store.bucket:
            return self._answer(404, b"<Error><Code>NoSuchBucket</Code></Error>")
        if not key and query.get("list-type") == "2":
            return self._answer(200, _listing(self.store, query))
        value = self.store.objects.get(key)
        if value is None:
            return self._answer(404, b"<Error><Code>NoSuchKey</Code><Message>The key does not exist</Message></Error>")
        size = _size(value)
        start, end, status = 0, size, 200
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if wanted and self.store.honour_range:
            start, end, status = int(wanted[1]), min(size, int(wanted[2] or size - 1) + 1), 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        with contextlib.suppress(ConnectionError):  # a reader that stops early is no failure of ours
            if isinstance(value, Pattern):
                for piece in value.span(start, end):
                    self.wfile.write(piece)
            else:
                self.wfile.write(value[start:end])

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def lying_store() -> Iterator[LyingStore]:
    """A :class:`LyingStore` on loopback, for as long as the block runs."""
    handler: type[_Handler] = type("Handler", (_Handler,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    store = LyingStore(f"http://127.0.0.1:{server.server_address[1]}")
    handler.store = store
    thread = threading.Thread(target=server.serve_forever, name="lying-store", daemon=True)
    thread.start()
    try:
        yield store
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
