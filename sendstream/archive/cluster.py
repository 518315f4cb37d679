"""An archive checked on a Dask cluster (``verify s3://... --scheduler ADDRESS``): one task per stream.

The client lists the archive (:func:`~sendstream.archive.reading.to_verify`) and submits a task for each
stream to the scheduler at ``ADDRESS`` (``tcp://`` or ``tls://``; for ``tls://`` the certificates are
Dask's own settings, ``distributed.comm.tls.*``). A task carries the stream's name and manifest and the
bucket's name, nothing else: each worker reaches the store with the credentials and endpoint its own
environment gives boto3 (``AWS_*``, ``~/.aws``), and opens a sealed archive with the key in the file
:data:`KEY_VARIABLE` names on it. A worker that dies mid-task has its stream checked again elsewhere
(Dask reschedules it; one that kills ``distributed.scheduler.allowed-failures`` workers is a
:class:`~sendstream.errors.ClusterError`). The verdicts come back as they finish and are handed on in
chain order, so the report is the local pool's (:func:`~sendstream.archive.reading.verify`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

from .. import __version__
from .. import errors as e
from .catalog import Entry
from .reading import Verdict, process_client, to_verify, verdict
from .store import BucketClient, Location, calling

KEY_VARIABLE = "SENDSTREAM_ENCRYPT_KEY"  # on a worker: the file of the key a sealed archive is opened with
CONNECT_SECONDS = 10.0  # how long reaching the scheduler may take
TLS = ("ca-file", "client.cert", "client.key")  # Dask's settings a client of a tls:// scheduler needs


def check_here(location: Location, entry: Entry) -> Verdict:
    """A task: ``entry`` checked on this worker, with its own credentials, endpoint and key. A worker that
    cannot see the manifest the client listed (another endpoint, no access, no such bucket) raises, so
    that it is the cluster's error, never a verdict on the stream."""
    from ..transport.tls.keys import load_key

    path = os.environ.get(KEY_VARIABLE)
    key = load_key(path) if path else None
    manifest = entry.name + ".json"
    with calling(location.url(manifest)):
        process_client(None, location).head_object(Bucket=location.bucket, Key=location.key(manifest))
    return verdict(None, location, entry, key)


def verify(s3: BucketClient, location: Location, scheduler: str) -> Iterator[Verdict]:
    """Check every stream archived at ``location`` on the cluster of ``scheduler``: the verdicts of
    :func:`~sendstream.archive.reading.verify`, in its order."""
    distributed = _engine()
    _take(scheduler)  # a wrong address is said before the archive is listed
    problems, ordered = to_verify(s3, location)
    with _connected(distributed, scheduler) as client:
        try:
            client.wait_for_workers(1, timeout=CONNECT_SECONDS)
        except TimeoutError:
            raise e.ClusterError(f"the Dask scheduler at {scheduler} has no worker (none came in 10 s)") from None
        yield from problems
        keys = [f"sendstream-verify-{uuid.uuid4().hex}" for _ in ordered]
        futures = client.map(check_here, [location] * len(ordered), ordered, key=keys)
        for entry, future in zip(ordered, futures, strict=True):
            yield _result(distributed, future, location.url(entry.name))


def _engine() -> Any:
    try:
        import distributed
    except ImportError:
        raise e.UsageError("--scheduler needs Dask distributed: pip install 'sendstream[cluster]'") from None
    return distributed


def _take(scheduler: str) -> None:
    """Refuse an address Dask cannot take here (said before a client is made: one made for such an address
    hangs at exit, closing)."""
    import dask.config

    scheme, _, where = scheduler.partition("://") if "://" in scheduler else ("", "", "")
    host, _, port = where.rpartition(":")
    if scheme not in ("tcp", "tls") or not host or not port.isdigit():
        raise e.UsageError(f"--scheduler {scheduler!r}: expected tcp://HOST:PORT or tls://HOST:PORT")
    if scheme == "tcp" and dask.config.get("distributed.comm.require-encryption", None):
        raise e.UsageError(
            f"--scheduler {scheduler}: Dask's settings require encryption (distributed.comm.require-encryption): "
            "give the scheduler's tls:// address"
        )
    if scheme == "tls" and not all(dask.config.get(f"distributed.comm.tls.{x}", None) for x in TLS):
        raise e.UsageError(
            f"--scheduler {scheduler}: a tls:// scheduler needs Dask's TLS settings, the CA and this client's "
            "certificate and key (DASK_DISTRIBUTED__COMM__TLS__CA_FILE, DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT "
            "and DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY, or distributed.comm.tls in ~/.config/dask/)"
        )


def _connected(distributed: Any, scheduler: str) -> Any:
    try:
        return distributed.Client(scheduler, timeout=CONNECT_SECONDS, set_as_default=False)
    except ValueError as exc:  # an address Dask cannot take
        raise e.UsageError(f"--scheduler {scheduler!r}: {exc}") from None
    except (OSError, TimeoutError) as exc:
        why = e.reason(exc)
        if why.lower().startswith("timed out trying to connect"):  # Dask's word for any failure, refused too
            why = f"no answer in {CONNECT_SECONDS:g} s (is `dask scheduler` running there, and its TLS ours?)"
        raise e.ClusterError(f"cannot reach the Dask scheduler at {scheduler}: {why}") from None


def _result(distributed: Any, future: Any, url: str) -> Verdict:
    try:
        found: Verdict = future.result()
    except distributed.KilledWorker:
        raise e.ClusterError(
            f"{url}: every worker that checked it died (distributed.scheduler.allowed-failures); see the workers' logs"
        ) from None
    except e.SendStreamError as exc:  # a worker's own setting (its key file), not the stream
        raise e.ClusterError(f"{url}: a worker could not check it: {exc}") from None
    except Exception as exc:
        raise e.ClusterError(
            f"{url}: a worker could not check it: {type(exc).__name__}: {exc} (is sendstream {__version__} "
            "installed on every worker?)"
        ) from None
    return found
