"""A bucket: each stream archived in object storage (:mod:`sendstream.archive`), as ``send --to s3://`` does."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from typing import Any

from .. import errors as e
from ..archive import reading
from ..archive.catalog import Entry, chains, entries, plan_prune, remove
from ..archive.reading import Verdict, archived, resolve
from ..archive.seal import Sealer
from ..archive.store import BucketClient, Location, connect
from ..archive.upload import Archived, upload
from ..io.framed import StreamSource
from ..retention import Policy
from ..session.receiver import SessionReceiver
from .store import Retained, Sender, Snapshot, Store, Taken


class Bucket(Store):
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
        self._client: BucketClient | None = None

    @classmethod
    def holding(cls, url: str, endpoint_url: str | None = None) -> tuple[Bucket, str]:
        """The bucket that ``url`` (``s3://BUCKET/PREFIX/SNAPSHOT``) names a snapshot in, and the snapshot."""
        held, snapshot = Location.parse(url).last()
        if not snapshot:
            raise e.UsageError(f"{url!r} names no snapshot: s3://BUCKET/PREFIX/SNAPSHOT (a name or UUID)")
        return cls(held, endpoint_url=endpoint_url), snapshot

    @property
    def client(self) -> BucketClient:
        if self._client is None:
            self._client = self._connect()
        return self._client

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
            retry_delay=retry_delay, sealer=_sealer(encrypt_key), change_sealing=change_sealing,
        )  # fmt: skip

    def verify(self, workers: int | None = None, encrypt_key: bytes | None = None) -> Iterator[Verdict]:
        """Check every stream archived here in place (:func:`~sendstream.archive.reading.verify`), ``workers``
        at once; a key of the wrong size is refused here, before any worker starts."""
        _sealer(encrypt_key)
        return reading.verify(self.client, self.location, self.endpoint_url, workers, encrypt_key)

    def chain(self, snapshot: str, encrypt_key: bytes | None = None) -> list[Entry]:
        """The streams that make ``snapshot`` (:func:`~sendstream.archive.reading.resolve`), each one's key
        checked: a mistake is said here, before a consumer starts."""
        return resolve(self.client, self.location, snapshot, _sealer(encrypt_key))

    def restore(
        self,
        chain: list[Entry],
        write: Callable[[Any], object],
        encrypt_key: bytes | None = None,
        *,
        consumer: str | None = None,
        wrote: Callable[[int], object] = lambda n: None,
    ) -> None:
        """Hand on the streams of ``chain`` (:func:`~sendstream.archive.reading.restore`)."""
        reading.restore(self.client, self.location, chain, write, _sealer(encrypt_key), consumer=consumer, wrote=wrote)

    def _snapshots(self) -> list[Snapshot]:
        return [
            {"name": x.name, "snapshot": x.snapshot or None, "uuid": x.uuid, "ctransid": x.ctransid,
             "parent_uuid": x.parent[0] if x.parent else None, "parent_ctransid": x.parent[1] if x.parent else None,
             "size": x.size, "stored": x.stored, "arrived": x.stored}
            for x in entries(self.client, self.location)
        ]  # fmt: skip

    def chains(self, problems: list[e.BadManifest]) -> list[list[tuple[int, Entry]]]:
        """The streams archived, as chains (:func:`~sendstream.archive.catalog.chains`); a manifest that
        cannot be taken, or a chain that goes round, is added to ``problems``."""
        return chains(archived(self.client, self.location, problems), problems)

    def prune(
        self,
        keep_last: int | None,
        since: str | None,
        problems: list[e.BadManifest],
        *,
        dry_run: bool = False,
        each: Callable[[Entry], object] = lambda entry: None,
        policy: Policy | None = None,
        now: datetime.datetime | None = None,
    ) -> tuple[list[Entry], list[Entry]]:
        """The streams kept and those that go (:func:`~sendstream.archive.catalog.plan_prune`, with
        ``policy`` at ``now``), never one a kept snapshot needs; each that goes is deleted (not with
        ``dry_run``), then told to ``each``."""
        found = archived(self.client, self.location, problems)
        kept, dropped = plan_prune(found, keep_last, since, problems, policy, now)
        for entry in dropped:
            if not dry_run:
                remove(self.client, self.location, entry)
            each(entry)
        return kept, dropped

    def retain(self, policy: Policy, now: datetime.datetime, *, dry_run: bool = False) -> Retained:
        """:meth:`prune` by ``policy`` alone (a manifest that cannot be taken is kept, as prune keeps it)."""
        kept, dropped = self.prune(None, None, [], dry_run=dry_run, policy=policy, now=now)
        return Retained(tuple(x.name for x in kept), tuple(x.name for x in dropped))


def _sealer(encrypt_key: bytes | None) -> Sealer | None:
    """What seals and opens the parts with ``encrypt_key`` (None without)."""
    return Sealer(encrypt_key) if encrypt_key is not None else None
