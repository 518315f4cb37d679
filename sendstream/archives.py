"""The commands of an archive in object storage: ``restore``, ``archive ls`` (``send --to s3://`` and
``verify s3://`` are the ``send`` and ``verify`` commands')."""

from __future__ import annotations

import json
import os
import stat
from typing import TYPE_CHECKING, Any

import click

from . import errors as e
from .manual import epilog
from .net.progress import BAR, Summary, size
from .ops.identity import printable
from .options import ProgressOptions, json_option, progress_options
from .terminal import Group, error, logger, warner

if TYPE_CHECKING:
    from .archive.store import Location
    from .net.progress import Progress

endpoint_option = click.option(
    "--endpoint-url",
    metavar="URL",
    default=None,
    help="The S3 endpoint (default: AWS_ENDPOINT_URL or the AWS config, else AWS S3).",
)


encrypt_key_option = click.option(
    "--encrypt-key",
    "encrypt_key",
    metavar="FILE",
    default=None,
    help="For s3://: the 32-byte key (sendstream key new FILE) its parts are sealed with, AES-256-GCM.",
)


change_sealing_option = click.option(
    "--change-sealing",
    is_flag=True,
    help="For s3://: archive the stream sealed otherwise (another --encrypt-key, or none) than the newest "
    "stream there; its later streams then follow it. Without it that is refused.",
)


def sealer(key_file: str | None) -> Any:
    """The :class:`~sendstream.archive.seal.Sealer` of ``--encrypt-key FILE`` (None without)."""
    if key_file is None:
        return None
    from .archive.seal import Sealer
    from .net.tls.keys import load_key

    return Sealer(load_key(key_file, warner()))


def where(url: str, endpoint_url: str | None) -> tuple[Location, object]:
    """The location of ``url`` and a client for it."""
    from .archive.store import Location, connect

    return Location.parse(url), connect(endpoint_url)


def send_to_archive(
    url: str,
    stream: str,
    endpoint_url: str | None,
    key_file: str | None,
    encrypt_key: str | None,
    retrying: dict[str, Any],
    show: ProgressOptions,
    change_sealing: bool = False,
) -> None:
    """``send --to s3://...``: archive STREAM there (``retrying``: ``resumable``, ``retries``, ``retry_delay``),
    its progress shown as ``send`` shows a transfer's."""
    from .archive.upload import upload

    key = None
    if retrying["resumable"]:
        if key_file is None:
            raise e.UsageError(
                "--resumable to s3:// needs --key FILE: the upload's state in the bucket is signed with it"
            )
        from .net.tls.keys import load_key

        key = load_key(key_file, warner())
    location, s3 = where(url, endpoint_url)
    progress = show.progress("archived")
    if progress.total is None and stream != "-" and stat.S_ISREG((status := os.stat(stream)).st_mode):
        progress.total = status.st_size
    try:
        done = upload(
            stream, location, s3, warn=warner(), key=key, notice=_notice(progress), wrote=progress.add,
            retries=retrying["retries"] if key else 0, retry_delay=retrying["retry_delay"], sealer=sealer(encrypt_key),
            change_sealing=change_sealing,
        )  # fmt: skip
    finally:
        progress.done()
    if not show.quiet:
        summary = Summary(done.size, progress.seconds, done.url, done.restarts, skipped=done.resumed)
        objects = f", {len(done.objects)} objects" if len(done.objects) > 1 else ""
        click.echo(f"sendstream: {summary.line('archived')}; {done.commands} commands{objects}", err=True)


def _notice(progress: Progress) -> Any:
    """Where passing notices (a retry) go: above the bar, else a line on stderr."""
    if progress.mode == BAR:
        return lambda text: progress.above(f"sendstream: {text}")
    return logger(True)


def verify_archive(
    url: str, endpoint_url: str | None, workers: int | None, encrypt_key: str | None, quiet: bool
) -> None:
    """``verify s3://...``: every archived stream checked in place; a line for each."""
    from .archive.reading import verify

    location, s3 = where(url, endpoint_url)
    seal = sealer(encrypt_key)  # a key of the wrong size is refused before any worker starts
    key = seal.key if seal is not None else None
    bad = count = 0
    for verdict in verify(s3, location, endpoint_url, workers, key):
        count += 1
        bad += verdict.problem is not None
        click.echo(f"{verdict.name}: {verdict.problem or 'ok'}")
    if not quiet:
        click.echo(f"sendstream: {count} stream{'s' * (count != 1)} checked, {bad} bad", err=True)
    if bad:
        raise SystemExit(e.EXIT_CORRUPT)


@click.command(cls=Group.command_class)
@click.argument("url", metavar="s3://BUCKET/PREFIX/SNAPSHOT")
@click.option("-o", "--output", default=None, metavar="FILE", help="Write the streams to FILE (- for stdout).")
@click.option("--exec", "command", default=None, metavar="CMD", help="Write the streams to the stdin of CMD (sh -c).")
@endpoint_option
@encrypt_key_option
@progress_options
def restore(
    url: str,
    output: str | None,
    command: str | None,
    endpoint_url: str | None,
    encrypt_key: str | None,
    show: ProgressOptions,
) -> None:
    """Hand on the full stream and every incremental up to SNAPSHOT, in order.

    SNAPSHOT is a snapshot's name or UUID as `sendstream archive ls` shows
    them (UUID.CTRANSID for one stream of a UUID). The chain and its keys are
    resolved before anything starts. Each stream is read in place with
    ranged GETs and every command is checked before it goes on; its END
    (where btrfs receive makes a snapshot read-only) goes on only once the
    stream is its manifest's. `--exec 'btrfs receive DIR'` receives the chain.
    """
    from .archive.reading import resolve
    from .archive.reading import restore as restore_chain
    from .io.outputs import is_special
    from .net.sinks import Target

    target = Target(output or (None if command else "-"), command, encrypted=False)
    location, s3 = where(url, endpoint_url)
    held, snapshot = location.last()
    if not snapshot:
        raise e.UsageError(f"{url!r} names no snapshot: s3://BUCKET/PREFIX/SNAPSHOT (a name or UUID)")
    key = sealer(encrypt_key)
    chain = resolve(s3, held, snapshot, key)  # a mistake is said here, not as "empty stream" by a child
    if command:
        consumer: str | None = repr(command)
    elif target.output == "-" or is_special(target.output or ""):
        consumer = "standard output" if target.output == "-" else repr(target.output)
    else:
        consumer = None  # a file appears only when all was good
    progress = show.progress("restored")
    if progress.total is None:
        progress.total = sum(entry.size for entry in chain)
    above = progress.above if progress.mode == BAR else None  # btrfs receive's `At subvol` goes above the bar
    try:
        with target.sink(True, None, None, notify=warner(), child_stderr=above) as sink:
            restore_chain(s3, held, chain, sink.write, key, consumer=consumer, wrote=progress.add)
    finally:
        progress.done()
    if not show.quiet:
        streams = f"{len(chain)} stream{'s' * (len(chain) != 1)}: {', '.join(entry.name for entry in chain)}"
        click.echo(f"sendstream: {Summary(progress.bytes, progress.seconds, streams).line('restored')}", err=True)


def problems_found(problems: list[e.BadManifest]) -> None:
    """Name each problem of the archive; then exit with their code, when there are any."""
    for problem in problems:
        error(str(problem))
    if problems:
        raise SystemExit(problems[0].exit_code)


@click.group(cls=Group)
def archive() -> None:
    """What an archive in object storage (s3://BUCKET/PREFIX) holds."""


@archive.command("ls", epilog=epilog("archive ls"))
@click.argument("url", metavar="s3://BUCKET/PREFIX")
@json_option("stream, chain by chain (depth 0 begins one)")
@endpoint_option
def archive_ls(url: str, as_json: bool, endpoint_url: str | None) -> None:
    """The snapshots archived, as chains: a full stream, then the incrementals that build on it."""
    from .archive.catalog import chains
    from .archive.reading import archived

    location, s3 = where(url, endpoint_url)
    problems: list[e.BadManifest] = []
    for tree in chains(archived(s3, location, problems), problems):
        for depth, entry in tree:
            if as_json:
                click.echo(json.dumps(dict(entry.summary(), depth=depth), sort_keys=True))
                continue
            kind = "full" if entry.parent is None else ("incremental" if depth else "incremental, parent missing")
            line = f"{'  ' * depth}{entry.uuid}.{entry.ctransid}  {kind}  {size(entry.size)}  {entry.stored}"
            click.echo(printable(line + (f"  {entry.snapshot}" if entry.snapshot else "")))  # (as its manifest says)
    problems_found(problems)


@archive.command("prune", epilog=epilog("archive prune"))
@click.argument("url", metavar="s3://BUCKET/PREFIX")
@click.option("--keep-last", type=click.IntRange(1), default=None, help="Keep the last N snapshots stored.")
@click.option("--keep-since", "since", metavar="DATE", default=None, help="Keep those stored on or after DATE (ISO).")
@click.option("--dry-run", is_flag=True, help="Only say what would go.")
@endpoint_option
def archive_prune(url: str, keep_last: int | None, since: str | None, dry_run: bool, endpoint_url: str | None) -> None:
    """Delete old streams, never one that a kept snapshot needs (its parent, up to its full stream)."""
    from .archive.catalog import keeping, plan_prune, remove
    from .archive.reading import archived

    keeping(keep_last, since)  # before the store is asked anything
    location, s3 = where(url, endpoint_url)
    problems: list[e.BadManifest] = []
    kept, dropped = plan_prune(archived(s3, location, problems), keep_last, since, problems)
    for entry in dropped:
        if not dry_run:
            remove(s3, location, entry)
        click.echo(
            printable(f"{'would delete' if dry_run else 'deleted'} {entry.name}  {size(entry.size)}  {entry.stored}")
        )
    gone = sum(x.size for x in dropped)
    verb = "would go" if dry_run else "deleted"
    click.echo(f"sendstream: {len(kept)} kept, {len(dropped)} {verb} ({size(gone)})", err=True)
    problems_found(problems)
