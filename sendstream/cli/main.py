"""The group and the commands on a stream (dump, verify, convert, ls, diff, repair, extract, paths,
stats): options in, one library call, output.

The options are declared in :mod:`sendstream.cli.options`; what the person at
the terminal sees and types (warnings, the password, exit codes) is
:mod:`sendstream.cli.terminal`; see the docs' table of exit codes (docs/reference/exit-codes.md).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from .. import __version__
from .options import (
    ListenOptions,
    TlsOptions,
    convert_options,
    encrypt_key_option,
    endpoint_option,
    extract_options,
    given,
    in_out_arguments,
    json_option,
    listen_options,
    max_size_option,
    progs_style_option,
    stream_argument,
    stream_or_place_argument,
    summary_option,
    tls_options,
    tracker_options,
    verbose_option,
)
from .terminal import Group, error, logger, run_command, warn, warner

# What only some commands need loads when they run (the commands of other modules too): imported up
# front it would double every command's start-up. The TLS package is light until a connection loads its library.
ELSEWHERE = {
    "send": ".remote:send",
    "receive": ".remote:receive",
    "relay": ".remote:relay",
    "key": ".admin:key",
    "man": ".admin:man",
    "serve": ".admin:serve",
    "restore": ".archive:restore",
    "archive": ".archive:archive",
    "backup": ".backup:backup",
}


@click.group(cls=Group, lazy=ELSEWHERE, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="sendstream")
@click.option("--traceback", "show_traceback", is_flag=True, help="Show a Python traceback on errors.")
@click.pass_context
def cli(ctx: click.Context, show_traceback: bool) -> None:
    """Read, check, convert and move btrfs send streams."""
    ctx.obj = {"traceback": show_traceback}


@cli.command()
@stream_argument
@json_option("command")
@progs_style_option
@click.option(
    "--raw-xattr-data",
    is_flag=True,
    help="With --progs-style 6.2: xattr data raw, up to a NUL, exactly as 6.2 prints it (a value may break its line).",
)
@click.option("--strict", is_flag=True, help="Reject commands and attributes unknown to the stream's version.")
@max_size_option
def dump(stream: str, **options: Any) -> None:
    """Print every command of STREAM (a file or -), like `btrfs receive --dump`.

    The text is that of current btrfs-progs unless --progs-style says 6.2.
    Unlike btrfs-progs, every stream of a file holding several back to back
    is printed (btrfs-progs stops after the first), and the 6.2 style escapes
    xattr data (6.2 prints it raw, up to a NUL) unless --raw-xattr-data is
    given. --json is the same in both styles.
    """
    from ..render.dump import dump as write_dump

    write_dump(stream, sys.stdout.buffer, warn=warn, **given(**options))


@cli.command()
@stream_or_place_argument
@click.option("--keep-going", is_flag=True, help="Report every problem, not only the first.")
@click.option("--scan", is_flag=True, help="Only list every stream header in STREAM, wherever it is.")
@click.option("--from-socket", "address", metavar="HOST:PORT", help="Listen there and verify what one sender sends.")
@tls_options()
@listen_options()
@summary_option
@verbose_option("Say which verifier and CRC implementation ran.")
@max_size_option
@endpoint_option
@encrypt_key_option
@click.option(
    "--workers", type=click.IntRange(1), default=None, help="For s3://: streams checked at once (every core)."
)
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    default=None,
    help="For s3://: check on the Dask cluster of that scheduler (tcp:// or tls://), one task per stream.",
)
def verify(
    stream: str,
    keep_going: bool,
    scan: bool,
    address: str | None,
    tls: TlsOptions,
    listen: ListenOptions,
    quiet: bool,
    verbose: bool,
    max_command_size: int | None,
    endpoint_url: str | None,
    encrypt_key: str | None,
    workers: int | None,
    scheduler: str | None,
) -> None:
    """Check STREAM (a file or -): framing, CRCs, commands, attributes, END.

    STREAM may be s3://BUCKET/PREFIX, or a directory that is a service's file
    place: every stream archived there is checked in place (ranged GETs, no
    local copy), many at once, each against its manifest; a line for each,
    and exit 1 when any is bad. With --scheduler, each s3:// stream is a task
    on a Dask cluster whose workers reach the store themselves.
    """
    if verbose:
        from ..codec.backend import default as default_backend

        used = default_backend()
        click.echo(f"sendstream: verifier: {used.path}; crc32c: {used.crc_name}", err=True)
    from ..stores import at

    if (store := at(stream, endpoint_url)) is not None:
        from .archive import verify_store

        verify_store(store, workers, encrypt_key, quiet, scheduler)
        return
    if scheduler is not None:
        raise click.UsageError(f"--scheduler: only for s3://BUCKET/PREFIX, not {stream!r}")
    if scan:
        from ..format.layout import MAX_VERSION
        from ..ops.verify import find_headers

        headers = list(find_headers(stream))
        for offset, version in headers:
            valid = "" if 1 <= version <= MAX_VERSION else " (not a valid version)"
            click.echo(f"offset {offset}: stream header, version {version}{valid}")
        if not quiet:
            click.echo(f"{len(headers)} stream header{'s' * (len(headers) != 1)}")
        return
    if address:
        from ..endpoints.receiving import verify_from_socket

        listening = listen.listening(address, tls, tls.key())
        report = verify_from_socket(
            listening,
            warn=warner(),
            log=logger(verbose),
            keep_going=keep_going,
            max_command_size=max_command_size,
            announce=logger(True),
        )
    else:
        from ..ops.verify import verify as verify_input

        report = verify_input(stream, keep_going=keep_going, max_command_size=max_command_size)
    from ..io.framed import tell_problems

    tell_problems(report.problems, error)
    tell_problems(report.warnings, warn)
    if not quiet:
        click.echo(report.summary())
    sys.exit(report.exit_code)


@cli.command()
@in_out_arguments
@convert_options
@max_size_option
def convert(
    source: str,
    target: str,
    to_version: int | None,
    max_zero_fill: int | None,
    max_names: int | None,
    parent: tuple[str, ...],
    max_command_size: int | None,
) -> None:
    """Rewrite stream IN into OUT (- for stdin/stdout) through the writer.

    With no options the output is byte-identical to a valid input. A file
    OUT appears only when the whole input was read without error. An
    incremental that punches holes in files of its parent (as kernel v2
    incrementals do) converts to v1 only with --parent: the zeros stop at
    each file's size, which the stream does not show.
    """
    if to_version is None and (max_zero_fill is not None or max_names is not None or parent):
        raise click.UsageError("--max-zero-fill, --max-names and --parent go with --to-version 1")
    from ..ops.convert import convert as write_converted

    limits = given(max_zero_fill=max_zero_fill, max_names=max_names)
    write_converted(
        source, target, to_version=to_version, max_command_size=max_command_size, warn=warn, parent=parent, **limits
    )


@cli.command(name="ls")
@stream_argument
@json_option("subvolume")
@tracker_options
@max_size_option
def ls_command(stream: str, **options: Any) -> None:
    """List every path STREAM (a file or -) touches, with the kind of change.

    One line per name, under its final path: created, linked (a new hard
    link, `to` another name), deleted, renamed (`from` the old path),
    modified (data) or metadata, then [data mode,owner,times,xattrs,...].
    btrfs' temporary names never show: a file created as o257-5-0 and
    renamed into place is `created` at its final path.
    """
    from ..render.changes import write_changes

    write_changes(stream, sys.stdout.buffer, warn=warn, **given(**options))


@cli.command()
@stream_argument
@json_option("subvolume")
@tracker_options
@max_size_option
def diff(stream: str, **options: Any) -> None:
    """What the incremental STREAM (a file or -) changes against its parent.

    Text, as `git diff --name-status`: A added (a new hard link says to
    what), D removed, R old -> new (renamed or moved; swaps and the btrfs
    LINK + UNLINK form included), M data modified, m metadata only; then
    [data mode,owner,times,xattrs,fileattr]. --json: added, removed,
    renamed (from, to), modified, metadata.
    """
    from ..render.changes import write_changes

    write_changes(stream, sys.stdout.buffer, diff=True, warn=warn, **given(**options))


@cli.command()
@in_out_arguments
@click.option("--keep-last", is_flag=True, help="Keep only what follows the last restart (OUT must be seekable).")
@summary_option
@max_size_option
def repair(source: str, target: str, keep_last: bool, quiet: bool, max_command_size: int | None) -> None:
    """Write the clean stream of IN (a restarted `btrfs send`) to OUT (- for stdin/stdout).

    Each command goes out only after its CRC is checked. After a restart the
    replayed commands must match those already written (length and CRC);
    they are dropped with the partial command before the restart. A file OUT
    appears only when the whole input was repaired.
    """
    from ..ops.repair import repair as write_repaired
    from ..ops.repair import summary_lines

    healer = write_repaired(source, target, keep_last=keep_last, max_command_size=max_command_size, warn=warn)
    if not quiet:
        click.echo("\n".join(f"sendstream: {line}" for line in summary_lines(healer)), err=True)


@cli.command()
@click.argument("stream", type=click.Path(dir_okay=False, allow_dash=True))
@click.argument("directory", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@extract_options
@max_size_option
def extract(stream: str, directory: str, clone_from: tuple[str, ...], quiet: bool, **options: Any) -> None:
    """Apply STREAM (a file or -) to DIR in user space, without btrfs.

    A full stream needs an empty DIR, which becomes the subvolume; an
    incremental one is applied in place onto a DIR that holds the extraction
    of its parent (empty for an empty parent; one that clones from its parent
    needs --clone-from PARENT_UUID=COPY, an untouched copy). Nothing is ever written outside DIR: paths with '..',
    absolute paths and paths through symlinks are refused. Commands that
    cannot apply here (fileattr, --no-data extents, xattrs or devices the
    file system or user may not have) are skipped with a warning.
    """
    from ..extract import extract_stream, parse_clone_from

    sources, dirs = parse_clone_from(clone_from)
    report = extract_stream(stream, directory, clone_sources=sources, clone_dirs=dirs, warn=warn, **given(**options))
    if not quiet:
        for group in report.skip_groups():
            more = f" (and {group.count - 1} more {'of other kinds' if group.other else 'like it'})"
            warn(f"skipped: {group.kept[0]}{more if group.count > 1 else ''}")
        click.echo(f"sendstream: {report.summary()}", err=True)


@cli.command()
@stream_argument
@json_option("command")
@tracker_options
@max_size_option
def paths(stream: str, **options: Any) -> None:
    """Print each command of STREAM (a file or -) with the final path it affects.

    btrfs send makes files under temporary names (o<ino>-<gen>-<seq>) and
    renames them later; each command is shown with the path its file has
    once its subvolume is done (- when the file is gone, . for the root),
    and was=PATH when the command named another. Output for a subvolume
    comes when its END is read; a command without a path (one the library
    does not know) is printed at once.
    """
    from ..render.paths import write_paths

    write_paths(stream, sys.stdout.buffer, warn=warn, **given(**options))


@cli.command()
@stream_argument
@max_size_option
def stats(stream: str, **options: Any) -> None:
    """Count commands and bytes per command kind in each stream of STREAM (a file or -)."""
    from ..render.paths import write_stats

    write_stats(stream, sys.stdout.buffer, warn=warn, **given(**options))


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and map every error to its exit code, in one place."""
    return run_command(cli, argv)
