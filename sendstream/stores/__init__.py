"""The places streams are kept in (:mod:`.store`); :func:`at`, the one a command reaches itself."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from .catalogued import Catalogued


def at(place: str, endpoint_url: str | None = None) -> Catalogued | None:
    """The store a command reaches at ``place`` itself: the bucket of ``s3://BUCKET/PREFIX`` (its client from
    boto3's chain, ``endpoint_url`` first, made when first asked), or the file place a directory is (a
    service's, read as an archive); None for any other place (a stream file, a HOST:PORT). Nothing heavy is
    imported for a place that is not a store."""
    if place.startswith("s3://"):
        from .bucket import Bucket

        return Bucket(place, endpoint_url=endpoint_url)
    if os.path.isdir(place):
        from .files import FilePlace

        return FilePlace(os.path.abspath(place))
    return None


def catalogue(place: str, endpoint_url: str | None = None) -> Catalogued:
    """The archive at ``place``: :func:`at`'s store, or a usage error naming ``place``."""
    store = at(place, endpoint_url)
    if store is None:
        raise UsageError(f"{place!r} is neither s3://BUCKET/PREFIX nor a directory (a service's file place)")
    return store


def holding(place: str, endpoint_url: str | None = None) -> tuple[Catalogued, str]:
    """The archive that ``place`` (``s3://BUCKET/PREFIX/SNAPSHOT`` or ``DIR/SNAPSHOT``) names a snapshot in,
    and the snapshot (a name or UUID)."""
    if place.startswith("s3://"):
        from .bucket import Bucket

        return Bucket.holding(place, endpoint_url)
    directory, snapshot = os.path.split(place)
    if not snapshot:  # DIR/ or /: a place, no snapshot in it
        raise UsageError(f"{place!r} names no snapshot: DIR/SNAPSHOT (a name or UUID) or s3://BUCKET/PREFIX/SNAPSHOT")
    return catalogue(directory or ".", endpoint_url), snapshot
