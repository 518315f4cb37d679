"""A bucket: each stream archived in object storage (:mod:`sendstream.archive`), as ``send --to s3://`` does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import errors as e
from ..archive.catalog import entries
from ..archive.store import BucketClient, Location, connect
from ..archive.upload import Archived, upload
from ..io.framed import StreamSource
from ..session.receiver import SessionReceiver
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

    @classmethod
    def holding(cls, url: str, endpoint_url: str | None = None) -> tuple[Bucket, str]:
        """The bucket that ``url`` (``s3://BUCKET/PREFIX/SNAPSHOT``) names a snapshot in, and the snapshot."""
        held, snapshot = Location.parse(url).last()
        if not snapshot:
            raise e.UsageError(f"{url!r} names no snapshot: s3://BUCKET/PREFIX/SNAPSHOT (a name or UUID)")
        return cls(held, endpoint_url=endpoint_url), snapshot

    def take(self, session: SessionReceiver, sender: Sender) -> Taken:
        """Check the stream of ``session`` and archive it (as ``send --to s3://``); its name, size and snapshot."""
        done = upload(
            session,  # type: ignore[arg-type]
            self.location, self.client, wrote=session.wrote, client=sender.identity, peer=sender.peer,
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
