"""A claim on one stream in a bucket that several services share: ``NAME.claim``, a small object.

Made with a conditional PUT (``If-None-Match: *``: of many made at once, the store keeps one), held
by renewing it every :data:`RENEW_SECONDS` (``If-Match`` its ETag: a renewal after another took it
over fails), taken over once it lapsed (:data:`LEASE_SECONDS` after its last renewal, by the taker's
clock: the services' clocks must agree to well within that), and deleted when its transfer ends
(``If-Match``: never another's). While one service holds it, another that is sent the same stream
(a sender that reconnected through the balancer to another service) refuses it as busy, and the
sender tries again; once the holder is gone (killed: it renews no more), the claim lapses and the
next try takes it, with the upload state the holder left (:mod:`.state`).

Stores that take conditional writes: AWS S3, SeaweedFS (tested: of 20 PUTs at once one wins, 20 of
20 rounds), MinIO, Ceph RGW (Reef on). A store that ignores the condition lets two services take the
same claim: the docs say to run one service per bucket prefix there.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import errors as e
from .store import BucketClient, Location, answered, calling, missing

CLAIM_SUFFIX = ".claim"
LEASE_SECONDS = 20.0
RENEW_SECONDS = 5.0
MAX_CLAIM = 4 << 10  # a claim's body: more is not one of ours


def precondition_failed(exc: BaseException) -> bool:
    """Whether a store error says a condition of the request did not hold (HTTP 412)."""
    return isinstance(exc, e.StoreError) and any(x in exc.reason for x in ("PreconditionFailed", "412"))


def holder() -> str:
    """Who this process is, as a claim names it."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Lease:
    """The claim on the stream ``name`` at ``location``, for ``who``: :meth:`take`, then :meth:`hold` it
    (renewed in a thread until :meth:`release`; ``lost`` is called when a renewal finds it taken)."""

    def __init__(
        self,
        s3: BucketClient,
        location: Location,
        name: str,
        who: str,
        *,
        clock: Callable[[], float] = time.time,
        seconds: float = LEASE_SECONDS,
        renew: float = RENEW_SECONDS,
    ) -> None:
        self._s3, self._location, self._who, self._clock = s3, location, who, clock
        self._seconds, self._renew = seconds, renew
        self._key = location.key(name + CLAIM_SUFFIX)
        self.url = location.url(name + CLAIM_SUFFIX)
        self._etag = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> None:
        """Make the claim, or take over one that lapsed; :class:`~sendstream.errors.SessionError` ``busy``
        when another holds it."""
        if self._put(IfNoneMatch="*"):
            return
        try:
            with calling(self.url):
                answer = self._s3.get_object(Bucket=self._location.bucket, Key=self._key)
        except e.StoreError as exc:
            if missing(exc) and self._put(IfNoneMatch="*"):  # released between the two
                return
            raise
        etag = answered(answer, "ETag", self.url)
        body = answer["Body"].read(MAX_CLAIM + 1)
        who, until = _said(body)
        if until > self._clock():
            raise e.SessionError(
                f"busy: another service ({who}) is receiving this stream; its claim {self.url} lapses in "
                f"{until - self._clock():.0f} s unless renewed; try again later"
            )
        if not self._put(IfMatch=etag):
            raise e.SessionError(f"busy: another service took over the lapsed claim {self.url}; try again later")

    def hold(self, lost: Callable[[], object]) -> None:
        """Renew the claim every ``renew`` seconds in a thread; ``lost`` hears when it was taken over."""

        def renew() -> None:
            while not self._stop.wait(self._renew):
                try:
                    if not self._put(IfMatch=self._etag):
                        lost()
                        return
                except e.StoreError:
                    continue  # the store did not answer: the next renewal may, within the lease

        self._thread = threading.Thread(target=renew, name="sendstream-claim", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and delete the claim, if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            with calling(self.url):
                self._s3.delete_object(Bucket=self._location.bucket, Key=self._key, IfMatch=self._etag)
        except e.StoreError as exc:
            if not (precondition_failed(exc) or missing(exc)):
                raise

    def _put(self, **condition: str) -> bool:
        """PUT the claim under ``condition``: whether it held (the claim is ours, its ETag kept)."""
        body = json.dumps({"holder": self._who, "until": self._clock() + self._seconds}).encode()
        try:
            with calling(self.url):
                answer: Any = self._s3.put_object(Bucket=self._location.bucket, Key=self._key, Body=body, **condition)
        except e.StoreError as exc:
            if precondition_failed(exc):
                return False
            raise
        self._etag = answered(answer, "ETag", self.url)
        return True


def _said(body: bytes) -> tuple[str, float]:
    """Who holds a claim and until when; a claim that is not ours lapsed long ago."""
    try:
        note = json.loads(body[:MAX_CLAIM])
        return str(note["holder"])[:200], float(note["until"])
    except (ValueError, KeyError, TypeError):
        return "?", 0.0
