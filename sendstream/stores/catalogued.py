"""A store whose streams are catalogued by their manifests (:mod:`sendstream.archive`): a bucket, or a
service's file place read as one. Both list their chains, check every stream in place, hand on the chain
that makes a snapshot, and prune, by the same code; only how an object is reached differs (an S3 client,
or the files of a directory)."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from typing import Any

from .. import errors as e
from ..archive import reading
from ..archive.catalog import Entry, chains, plan_prune, remove
from ..archive.reading import Verdict, archived, resolve
from ..archive.seal import Sealer
from ..archive.store import BucketClient, Directory, Location
from ..retention import Policy
from .store import Retained, Store


class Catalogued(Store):
    """The streams at ``location``, reached through the client ``_connect()`` gives when first asked."""

    location: Location
    endpoint_url: str | None = None  # :meth:`verify`'s processes reach the location with it
    _connect: Callable[[], BucketClient]
    _client: BucketClient | None = None

    @property
    def client(self) -> BucketClient:
        if self._client is None:
            self._client = self._connect()
        return self._client

    def verify(
        self, workers: int | None = None, encrypt_key: bytes | None = None, scheduler: str | None = None
    ) -> Iterator[Verdict]:
        """Check every stream held here in place (:func:`~sendstream.archive.reading.verify`), ``workers``
        at once, or on the Dask cluster of ``scheduler`` (:func:`~sendstream.archive.cluster.verify`); a
        key of the wrong size is refused here, before any worker starts."""
        sealer_of(encrypt_key)
        if scheduler is None:
            return reading.verify(self.client, self.location, self.endpoint_url, workers, encrypt_key)
        from ..archive import cluster

        if isinstance(self.location, Directory):
            raise e.UsageError("--scheduler: only for s3://BUCKET/PREFIX (a directory is this machine's own)")
        if encrypt_key is not None or workers is not None:
            raise e.UsageError(
                f"--scheduler: each worker checks with its own key ({cluster.KEY_VARIABLE}, in its environment) "
                "and threads, so --encrypt-key and --workers are not given here"
            )
        return cluster.verify(self.client, self.location, scheduler)

    def chain(self, snapshot: str, encrypt_key: bytes | None = None) -> list[Entry]:
        """The streams that make ``snapshot`` (:func:`~sendstream.archive.reading.resolve`), each one's key
        checked: a mistake is said here, before a consumer starts."""
        return resolve(self.client, self.location, snapshot, sealer_of(encrypt_key))

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
        reading.restore(
            self.client, self.location, chain, write, sealer_of(encrypt_key), consumer=consumer, wrote=wrote
        )

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
        newest: bool = False,
    ) -> tuple[list[Entry], list[Entry]]:
        """The streams kept and those that go (:func:`~sendstream.archive.catalog.plan_prune`, with
        ``policy`` at ``now``, and with ``newest`` the newest of each subvolume), never one a kept snapshot
        needs; each that goes is deleted (not with ``dry_run``), then told to ``each``."""
        found = archived(self.client, self.location, problems)
        kept, dropped = plan_prune(found, keep_last, since, problems, policy, now, newest)
        for entry in dropped:
            if not dry_run:
                remove(self.client, self.location, entry)
            each(entry)
        return kept, dropped

    def retain(self, policy: Policy, now: datetime.datetime, *, dry_run: bool = False) -> Retained:
        """:meth:`prune` by ``policy`` alone (a manifest that cannot be taken is kept, as prune keeps it), and
        the newest of each subvolume whatever the minimum: the base of its client's next incremental."""
        try:
            kept, dropped = self.prune(None, None, [], dry_run=dry_run, policy=policy, now=now, newest=True)
        except e.NothingFound:
            return Retained((), ())  # nothing held: nothing to keep or delete
        return Retained(tuple(x.name for x in kept), tuple(x.name for x in dropped))


def sealer_of(encrypt_key: bytes | None) -> Sealer | None:
    """What seals and opens the parts with ``encrypt_key`` (None without)."""
    return Sealer(encrypt_key) if encrypt_key is not None else None
