"""``backup run`` and ``backup status``: the nightly flow on this host (:mod:`sendstream.backup`)."""

from __future__ import annotations

import datetime
import json
from typing import Any

import click

from .. import errors as e
from ..backup.config import DEFAULT_PATH, load
from ..transfer.identity import printable
from .manual import epilog
from .options import json_option, verbose_option
from .terminal import Group, logger, warn

config_option = click.option(
    "--config",
    "config_path",
    default=DEFAULT_PATH,
    show_default=True,
    type=click.Path(dir_okay=False),
    help="The backup's settings: subvolumes, targets, policies (docs/guides/backups.md).",
)


@click.group(cls=Group)
def backup() -> None:
    """The nightly flow on this host, from one TOML file: snapshot each subvolume, send each target what
    it lacks from the newest parent it holds, keep what the policies say."""


@backup.command("run", epilog=epilog("backup run"))
@config_option
@click.option("--dry-run", is_flag=True, help="Say what a run would take, send and delete; change nothing.")
@verbose_option("Say which TLS path each connection uses, and every reconnect.")
def backup_run(config_path: str, dry_run: bool, verbose: bool) -> None:
    """Take a read-only snapshot of each subvolume (NAME.YYYYMMDDTHHMM), send
    every target the snapshots it lacks (incremental from the newest one it
    holds, matched by UUID; whole when it holds none, or when full_every says),
    then keep what each policy says, never a snapshot a target still needs.

    A target that fails is named and the others go on; the run then exits 10.
    Two runs never overlap: the second stops (exit 4).
    """
    from ..backup.run import run

    report = run(
        load(config_path, warn), dry_run=dry_run, say=lambda line: click.echo(printable(line)), log=logger(verbose)
    )
    if report.failed:
        raise e.BackupFailed(report.failed)


@backup.command("status", epilog=epilog("backup status"))
@config_option
@json_option("subvolume and target")
def backup_status(config_path: str, as_json: bool) -> None:
    """For each subvolume and target: the newest snapshot the target holds
    and its age, the chain it ends, what the next run sends. Exits 11 when a
    target's newest is older than its warn_after (or it holds none, or cannot
    be reached), for a monitoring check or a timer's OnFailure=.
    """
    from ..backup.run import status

    rows = status(load(config_path, warn))
    for row in rows:
        click.echo(json.dumps(row, sort_keys=True) if as_json else printable(_line(row)))
    if stale := [f"{row['subvolume']} -> {row['target']}" for row in rows if row["stale"]]:
        raise e.Stale(stale)


def _line(row: dict[str, Any]) -> str:
    head = f"{row['subvolume']} -> {row['target']} ({row['kind']}): "
    if row.get("error"):
        return head + f"cannot say: {row['error']}"
    if row["last"] is None:
        return head + "holds none; the next run sends one whole"
    ago = datetime.timedelta(seconds=row["age_seconds"])
    text = head + f"last {row['last']} ({ago} ago), chain {row['chain']}"
    nexts = [f"{s['snapshot']} {'from ' + s['parent'] if s['parent'] else 'whole'}" for s in row["next"]]
    text += f"; next: {', '.join(nexts)}" if nexts else "; next: the new snapshot only"
    return text + (" BEHIND" if row["stale"] else "")
