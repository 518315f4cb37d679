"""A bucket: each stream archived in object storage (:mod:`sendstream.archive`), as ``send --to s3://`` does."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from .. import errors as e
from ..archive import state
from ..archive.catalog import entries
from ..archive.lease import Lease, holder
from ..archive.store import BucketClient, Location, calling, connect
from ..archive.upload import Archived, archived_as, continuable, upload
from ..io.framed import StreamSource
from ..session.receiver import SessionReceiver
from ..session.resume import WINDOW_SIZE
from ..transfer.identity import Identity
from ..transfer.ledger import Checkpoint
from ..transfer.stored import stream_name
from .catalogued import Catalogued, sealer_of
from .store import Sender, Snapshot, Taken


class Bucket(Catalogued):
    """The archive at ``place`` (``s3://BUCKET/PREFIX``, or its :class:`~sendstream.archive.store.Location`),
    reached through the client ``client()`` gives when first asked (by default one from boto3's chain,
    ``endpoint_url`` first if given; :meth:`verify`'s processes make theirs so, whatever ``client``)."""

    kind = "bucket"
    journaled = False  # an upload keeps no journal in a place of ours

    def __init__(
        self,
        place: str | Location,
        client: Callable[[], BucketClient] | None = None,
        *,
        endpoint_url: str | None = None,
    ) -> None:
        self.location = place if isinstance(place, Location) else Location.parse(place)
        super().__init__(self.location.url() if isinstance(place, Location) else place)
        self.endpoint_url = endpoint_url
        self._connect = client or (lambda: connect(endpoint_url))
        self._earlier: state.UploadState | None = None  # what resumed() found, for take()
        self._fenced = False  # its claim was lost: no upload state is saved any more

    @classmethod
    def holding(cls, url: str, endpoint_url: str | None = None) -> tuple[Bucket, str]:
        """The bucket that ``url`` (``s3://BUCKET/PREFIX/SNAPSHOT``) names a snapshot in, and the snapshot."""
        held, snapshot = Location.parse(url).last()
        if not snapshot:
            raise e.UsageError(f"{url!r} names no snapshot: s3://BUCKET/PREFIX/SNAPSHOT (a name or UUID)")
        return cls(held, endpoint_url=endpoint_url), snapshot

    @contextlib.contextmanager
    def hold(self, identity: Identity, lost: Callable[[str], object], alive: Callable[[], int]) -> Iterator[None]:
        """Claim the stream of ``identity`` in the bucket while it is taken (:class:`~sendstream.archive.lease.
        Lease`, held while ``alive()`` grows): another service that shares the bucket refuses it as busy
        meanwhile. Once the claim is lost (``lost`` hears why) this transfer saves no upload state again:
        the state is the new holder's."""
        lease = Lease(self.client, self.location, stream_name(identity), holder())

        def fenced(why: str) -> None:
            self._fenced = True
            lost(why)

        lease.take()
        lease.hold(fenced, alive)
        try:
            yield
        finally:
            lease.release()

    def resumed(self, identity: Identity, key: bytes, discard: Callable[[str], object]) -> Checkpoint | None:
        """Where the upload of the stream of ``identity`` an earlier transfer began stands, by its state
        (signed with ``key``), when the store still holds its parts; kept for :meth:`take`. A state that is
        not ``key``'s or not ours is deleted, and ``discard`` hears why (the stream starts over)."""
        name = stream_name(identity)
        try:
            earlier = state.load(self.client, self.location, name, key)
        except e.ResumeError as exc:
            discard(str(exc))
            state.forget(self.client, self.location, name)
            return None
        if earlier is not None and earlier.stream != identity:  # another stream of that name began
            discard(f"{self.location.url(name)}: its upload state is of another stream of this name; starting over")
            self._abandon(name, earlier)
            return None
        if earlier is None or not continuable(self.client, self.location, earlier, discard):
            return None
        self._earlier = earlier
        return earlier.checkpoint

    def unfollowed(self) -> None:
        if self._earlier is not None:
            self._abandon(stream_name(self._earlier.stream), self._earlier)

    def _abandon(self, name: str, earlier: state.UploadState) -> None:
        """Delete ``earlier``'s state and abort its upload (what is left of it lapses with the store's rules)."""
        state.forget(self.client, self.location, name)
        with contextlib.suppress(e.StoreError), calling(self.location.url(earlier.key)):
            self.client.abort_multipart_upload(
                Bucket=self.location.bucket, Key=self.location.key(earlier.key), UploadId=earlier.upload_id
            )

    def take(self, session: SessionReceiver, sender: Sender) -> Taken:
        """Check the stream of ``session`` and archive it (as ``send --to s3://``); its name, size and snapshot.

        A session's upload is resumable (its state signed with the sender's key) and goes on from what
        :meth:`resumed` found; the sender hears acknowledged only what is in parts the store completed
        (and the state saved), so its resend window (:data:`~sendstream.session.resume.WINDOW_SIZE`) must
        hold the part filling and the one in flight: parts are at most a quarter of it, one in flight."""
        resume = self._earlier if self._earlier is not None and self._earlier.offset else None
        if session.identity is not None and resume is None:
            name = stream_name(session.identity)
            same = archived_as(self.client, self.location, name, session, session.wrote)  # type: ignore[arg-type]
            if same is not None:
                session.commit()
                return Taken(name, same.size, (same.snapshot,) if same.snapshot else (), already=True)
        part = WINDOW_SIZE // 4
        session.checkpoint = lambda written: session.verified  # what is written is durable once saved()
        done = upload(
            session,  # type: ignore[arg-type]
            self.location, self.client, wrote=session.wrote, client=sender.identity, peer=sender.peer,
            key=None if session.raw else sender.key, resume=resume, in_flight=part, max_part=part,
            saved=session.durable, fenced=lambda: self._fenced,
        )  # fmt: skip
        session.commit()
        return Taken(done.url.rsplit("/", 1)[1], done.size, (done.snapshot,) if done.snapshot else ())

    def upload(
        self,
        source: StreamSource,
        *,
        key: bytes | None = None,
        encrypt_key: bytes | None = None,
        change_sealing: bool = False,
        retries: int = 0,
        retry_delay: float = 1.0,
        warn: Any = None,
        notice: Callable[[str], object] = lambda text: None,
        wrote: Callable[[int], object] | None = None,
    ) -> Archived:
        """Archive the stream of ``source`` (:func:`~sendstream.archive.upload.upload`), in parts sealed
        with ``encrypt_key`` if given; with ``key`` resumable, tried again ``retries`` times."""
        return upload(
            source, self.location, self.client, warn=warn, key=key, notice=notice, wrote=wrote, retries=retries,
            retry_delay=retry_delay, sealer=sealer_of(encrypt_key), change_sealing=change_sealing,
        )  # fmt: skip

    def _snapshots(self) -> list[Snapshot]:
        return [
            {"name": x.name, "snapshot": x.snapshot or None, "uuid": x.uuid, "ctransid": x.ctransid,
             "parent_uuid": x.parent[0] if x.parent else None, "parent_ctransid": x.parent[1] if x.parent else None,
             "size": x.size, "stored": x.stored, "arrived": x.stored}
            for x in entries(self.client, self.location)
        ]  # fmt: skip
