"""The commands of an archive in object storage: ``restore``, ``archive ls`` (``send --to s3://`` and
``verify s3://`` are the ``send`` and ``verify`` commands')."""

from __future__ import annotations

import json
import os
import stat
from typing import TYPE_CHECKING, Any

import click

from .. import errors as e
from ..stores import catalogue
from ..transfer.identity import printable
from ..transfer.progress import BAR, Summary, size
from .manual import epilog
from .options import ProgressOptions, encrypt_key_option, endpoint_option, json_option, progress_options
from .terminal import Group, error, logger, read_key, warner

if TYPE_CHECKING:
    from ..archive.catalog import Entry
    from ..stores.store import Store
    from ..transfer.progress import Progress


def sealing_key(key_file: str | None) -> bytes | None:
    """The key of ``--encrypt-key FILE`` that parts are sealed with (None without)."""
    return read_key(key_file) if key_file is not None else None


def send_to_store(
    store: Store,
    stream: str,
    key_file: str | None,
    encrypt_key: str | None,
    retrying: dict[str, Any],
    show: ProgressOptions,
    change_sealing: bool = False,
) -> None:
    """``send --to s3://...``: archive STREAM there (``retrying``: ``resumable``, ``retries``, ``retry_delay``),
    its progress shown as ``send`` shows a transfer's."""
    key = None
    if retrying["resumable"]:
        if key_file is None:
            raise e.UsageError(
                "--resumable to s3:// needs --key FILE: the upload's state in the bucket is signed with it"
            )
        key = read_key(key_file)
    progress = show.progress("archived")
    if progress.total is None and stream != "-" and stat.S_ISREG((status := os.stat(stream)).st_mode):
        progress.total = status.st_size
    try:
        done = store.upload(
            stream, key=key, encrypt_key=sealing_key(encrypt_key), change_sealing=change_sealing,
            retries=retrying["retries"] if key else 0, retry_delay=retrying["retry_delay"], warn=warner(),
            notice=_notice(progress), wrote=progress.add,
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


def verify_store(
    store: Store, workers: int | None, encrypt_key: str | None, quiet: bool, scheduler: str | None = None
) -> None:
    """``verify s3://...``: every archived stream checked in place (on a cluster: ``scheduler``); a line for each."""
    bad = count = 0
    for verdict in store.verify(workers, sealing_key(encrypt_key), scheduler):
        count += 1
        bad += verdict.problem is not None
        click.echo(f"{verdict.name}: {verdict.problem or 'ok'}")
    if not quiet:
        click.echo(f"sendstream: {count} stream{'s' * (count != 1)} checked, {bad} bad", err=True)
    if bad:
        raise SystemExit(e.EXIT_CORRUPT)


@click.command(cls=Group.command_class)
@click.argument("url", metavar="s3://BUCKET/PREFIX/SNAPSHOT|DIR/SNAPSHOT")
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
    them (UUID.CTRANSID for one stream of a UUID), in a bucket or in a
    service's file place (DIR). The chain and its keys are resolved before
    anything starts. Each stream is read in place (ranged GETs from a bucket)
    and every command is checked before it goes on; its END
    (where btrfs receive makes a snapshot read-only) goes on only once the
    stream is its manifest's. `--exec 'btrfs receive DIR'` receives the chain.
    """
    from ..io.outputs import is_special
    from ..stores import holding
    from ..transfer.sinks import Target

    target = Target(output or (None if command else "-"), command, encrypted=False)
    store, snapshot = holding(url, endpoint_url)
    key = sealing_key(encrypt_key)
    chain = store.chain(snapshot, key)  # a mistake is said here, not as "empty stream" by a child
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
            store.restore(chain, sink.write, key, consumer=consumer, wrote=progress.add)
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
    """What an archive holds: object storage (s3://BUCKET/PREFIX) or a service's file place (DIR)."""


@archive.command("ls", epilog=epilog("archive ls"))
@click.argument("url", metavar="s3://BUCKET/PREFIX|DIR")
@json_option("stream, chain by chain (depth 0 begins one)")
@endpoint_option
def archive_ls(url: str, as_json: bool, endpoint_url: str | None) -> None:
    """The snapshots archived, as chains: a full stream, then the incrementals that build on it."""
    problems: list[e.BadManifest] = []
    for tree in catalogue(url, endpoint_url).chains(problems):
        for depth, entry in tree:
            if as_json:
                click.echo(json.dumps(dict(entry.summary(), depth=depth), sort_keys=True))
                continue
            kind = "full" if entry.parent is None else ("incremental" if depth else "incremental, parent missing")
            line = f"{'  ' * depth}{entry.uuid}.{entry.ctransid}  {kind}  {size(entry.size)}  {entry.stored}"
            click.echo(printable(line + (f"  {entry.snapshot}" if entry.snapshot else "")))  # (as its manifest says)
    problems_found(problems)


@archive.command("prune", epilog=epilog("archive prune"))
@click.argument("url", metavar="s3://BUCKET/PREFIX|DIR")
@click.option("--keep-last", type=click.IntRange(1), default=None, help="Keep the last N snapshots stored.")
@click.option("--keep-since", "since", metavar="DATE", default=None, help="Keep those stored on or after DATE (ISO).")
@click.option(
    "--preserve",
    metavar="POLICY",
    default=None,
    help='Keep what this btrbk preserve policy keeps ("14d 10w *m"), by the time in each snapshot\'s name.',
)
@click.option(
    "--preserve-min",
    metavar="AGE",
    default=None,
    help="With --preserve: keep everything younger (2d), or all, latest (the default), no.",
)
@click.option("--preserve-day-of-week", metavar="DAY", default="sunday", show_default=True, help="Weeks start on DAY.")
@click.option(
    "--preserve-hour-of-day", type=click.IntRange(0, 23), default=0, show_default=True, help="Days start at this hour."
)
@click.option("--dry-run", is_flag=True, help="Only say what would go.")
@endpoint_option
def archive_prune(
    url: str,
    keep_last: int | None,
    since: str | None,
    preserve: str | None,
    preserve_min: str | None,
    preserve_day_of_week: str,
    preserve_hour_of_day: int,
    dry_run: bool,
    endpoint_url: str | None,
) -> None:
    """Delete old streams, never one that a kept snapshot needs (its parent, up to its full stream)."""
    from ..archive.catalog import keeping
    from ..retention import policy

    if preserve is None and preserve_min is not None:
        raise e.UsageError("--preserve-min goes with --preserve POLICY")
    kept_by = (
        None
        if preserve is None
        else policy(preserve, preserve_min, day_of_week=preserve_day_of_week, hour_of_day=preserve_hour_of_day)
    )
    keeping(keep_last, since, kept_by)  # before the store is asked anything
    problems: list[e.BadManifest] = []

    def said(entry: Entry) -> None:
        click.echo(
            printable(f"{'would delete' if dry_run else 'deleted'} {entry.name}  {size(entry.size)}  {entry.stored}")
        )

    kept, dropped = catalogue(url, endpoint_url).prune(
        keep_last, since, problems, dry_run=dry_run, each=said, policy=kept_by
    )
    gone = sum(x.size for x in dropped)
    verb = "would go" if dry_run else "deleted"
    click.echo(f"sendstream: {len(kept)} kept, {len(dropped)} {verb} ({size(gone)})", err=True)
    problems_found(problems)
