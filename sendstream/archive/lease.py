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

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from .. import errors as e
from ..transfer.identity import printable
from .store import BucketClient, Location, answered, calling, missing

CLAIM_SUFFIX = ".claim"
LEASE_SECONDS = 20.0
RENEW_SECONDS = 5.0
MAX_CLAIM = 4 << 10  # a claim's body: more is not one of ours


def precondition_failed(exc: BaseException) -> bool:
    """Whether a store error says a condition of the request did not hold (HTTP 412), or that it lost a
    race of conditional requests the store saw at once (AWS S3's 409 ConditionalRequestConflict)."""
    return isinstance(exc, e.StoreError) and any(
        x in exc.reason for x in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
    )


def holder() -> str:
    """Who this process is, as a claim names it."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Lease:
    """The claim on the stream ``name`` at ``location``, for ``who``: :meth:`take`, then :meth:`hold` it
    (renewed in a thread until :meth:`release`)."""

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
        self._nonce = uuid.uuid4().hex  # this lease's own: a PUT whose answer was lost is known as ours
        self._etag = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> None:
        """Make the claim, or take over one that lapsed; :class:`~sendstream.errors.SessionError` ``busy``
        when another holds it (or takes it at the same time)."""
        if self._put(IfNoneMatch="*"):
            return
        found = self._read()
        if found is None:  # released between the two
            if self._put(IfNoneMatch="*"):
                return
            raise self._busy("another service claimed it at the same time")
        etag, who, until, _ = found
        left = until - self._clock()
        if 0 < left <= 2 * self._seconds:  # (more is no lease of ours: a forged or broken claim lapsed)
            raise self._busy(
                f"another service ({who}) is receiving it; its claim lapses in {left:.0f} s unless renewed"
            )
        if not self._put(IfMatch=etag):
            raise self._busy("another service took over its lapsed claim at the same time")

    def hold(self, lost: Callable[[str], object], alive: Callable[[], int]) -> None:
        """Renew the claim every ``renew`` seconds in a thread while the transfer moves (``alive()``, a
        count that grows with it, grew within twice the lease); ``lost`` hears why it stopped: the claim was
        taken over, could not be renewed within the lease, or the transfer stood still (a sender gone
        without a word holds the stream from its next connection no longer than that)."""

        def renew() -> None:
            renewed = moved = time.monotonic()
            seen = alive()
            while not self._stop.wait(self._renew):
                now = time.monotonic()
                if (count := alive()) != seen:
                    seen, moved = count, now
                elif now - moved >= 2 * self._seconds:
                    return self._lost(lost, f"nothing moved for {now - moved:.0f} s")
                try:
                    kept = self._put(IfMatch=self._etag) or self._ours()
                except e.StoreError as exc:
                    if not missing(exc) and time.monotonic() - renewed < self._seconds - self._renew:
                        continue  # the next renewal may work, within the lease
                    return self._lost(lost, f"the claim could not be renewed ({exc.reason})")
                if not kept:
                    return self._lost(lost, "another service took the claim over")
                renewed = time.monotonic()
            return None

        self._thread = threading.Thread(target=renew, name="sendstream-claim", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and delete the claim, if it is still ours; a store that does not answer leaves it
        to lapse (never an error: the transfer is told its end whatever comes of this)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(e.StoreError), calling(self.url):
            self._s3.delete_object(Bucket=self._location.bucket, Key=self._key, IfMatch=self._etag)

    def _lost(self, lost: Callable[[str], object], why: str) -> None:
        if not self._stop.is_set():  # (released meanwhile: the transfer ended, nothing to cut)
            lost(why)

    def _ours(self) -> bool:
        """After a renewal was refused: whether the claim is this lease's all the same (an earlier PUT of
        ours took, its answer lost and the request sent again); its ETag taken."""
        found = self._read()
        if found is None or found[3] != self._nonce:
            return False
        self._etag = found[0]
        return True

    def _read(self) -> tuple[str, str, float, str] | None:
        """The claim: its ETag, holder, time it lapses and nonce; None when there is none."""
        try:
            with calling(self.url):
                answer = self._s3.get_object(Bucket=self._location.bucket, Key=self._key)
                try:
                    body = answer["Body"].read(MAX_CLAIM + 1)
                finally:
                    answer["Body"].close()
        except e.StoreError as exc:
            if missing(exc):
                return None
            raise
        return (answered(answer, "ETag", self.url), *_said(body))

    def _busy(self, why: str) -> e.SessionError:
        return e.SessionError(f"busy: {why} ({self.url}); try again later")

    def _put(self, **condition: str) -> bool:
        """PUT the claim under ``condition``: whether it held (the claim is ours, its ETag kept); a
        condition that failed (412), or lost a race the store saw (409), is False."""
        body = json.dumps({"holder": self._who, "nonce": self._nonce, "until": self._clock() + self._seconds})
        try:
            with calling(self.url):
                answer: Any = self._s3.put_object(
                    Bucket=self._location.bucket, Key=self._key, Body=body.encode(), **condition
                )
        except e.StoreError as exc:
            if precondition_failed(exc) or (condition.get("IfMatch") and missing(exc)):
                return False
            raise
        self._etag = answered(answer, "ETag", self.url)
        return True


def _said(body: bytes) -> tuple[str, float, str]:
    """Who holds a claim, when it lapses and its nonce; a claim that is not ours lapsed long ago."""
    try:
        note = json.loads(body[:MAX_CLAIM])
        return printable(str(note["holder"])[:200]), float(note["until"]), str(note["nonce"])
    except (ValueError, KeyError, TypeError):
        return "?", 0.0, ""
