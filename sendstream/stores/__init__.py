"""The places streams are kept in (:mod:`.store`); :func:`at`, the one a command reaches itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .store import Store


def at(place: str, endpoint_url: str | None = None) -> Store | None:
    """The store a command reaches at ``place`` itself: the bucket of ``s3://BUCKET/PREFIX`` (its client from
    boto3's chain, ``endpoint_url`` first, made when first asked); None for any other place (a stream file,
    a HOST:PORT). Nothing heavy is imported for a place that is not a store."""
    if not place.startswith("s3://"):
        return None
    from .bucket import Bucket

    return Bucket(place, endpoint_url=endpoint_url)
