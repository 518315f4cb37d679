"""The command line: options in, one library call, output.

The options are declared in :mod:`sendstream.options`; what the person at
the terminal sees and types (warnings, the password, exit codes) is
:mod:`sendstream.terminal`; see the README's table of exit codes.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from . import __version__
from . import errors as e
from .admin import key, man
from .codec.crc import IMPLEMENTATION
from .codec.native import PATH
from .format.layout import MAX_VERSION
from .io.framed import tell_problems
from .io.windows import open_input
from .ops.verify import find_headers
from .options import (
    ListenOptions,
    ProgressOptions,
    SenderOptions,
    TlsOptions,
    convert_options,
    extract_options,
    given,
    idle_timeout_option,
    in_out_arguments,
    json_option,
    listen_options,
    max_size_option,
    output_options,
    progress_options,
    reconnect_timeout_option,
    relay_listen_option,
    resume_option,
    send_options,
    sender_options,
    stream_argument,
    summary_option,
    tls_options,
    to_option,
    tracker_options,
    verbose_option,
)
from .terminal import Group, error, logger, run_command, warn, warner

if TYPE_CHECKING:
    from collections.abc import Callable

    from .net.session.receiver import SessionReceiver
    from .net.sinks import Sink

# What only some commands need loads when they run: imported up front it would double every
# command's start-up. The TLS package is light until a connection loads its library.


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="sendstream")
@click.option("--traceback", "show_traceback", is_flag=True, help="Show a Python traceback on errors.")
@click.pass_context
def cli(ctx: click.Context, show_traceback: bool) -> None:
    """Read, check, convert and move btrfs send streams."""
    ctx.obj = {"traceback": show_traceback}


@cli.command()
@stream_argument
@json_option("command")
@click.option("--strict", is_flag=True, help="Reject commands and attributes unknown to the stream's version.")
@max_size_option
def dump(stream: str, **options: Any) -> None:
    """Print every command of STREAM (a file or -), like `btrfs receive --dump`."""
    from .render.dump import dump as write_dump

    write_dump(stream, sys.stdout.buffer, warn=warn, **given(**options))


@cli.command()
@stream_argument
@click.option("--keep-going", is_flag=True, help="Report every problem, not only the first.")
@click.option("--scan", is_flag=True, help="Only list every stream header in STREAM, wherever it is.")
@click.option("--from-socket", "address", metavar="HOST:PORT", help="Listen there and verify what one sender sends.")
@tls_options()
@listen_options()
@summary_option
@verbose_option("Say which verifier and CRC implementation ran.")
@max_size_option
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
) -> None:
    """Check STREAM (a file or -): framing, CRCs, commands, attributes, END."""
    if verbose:
        click.echo(f"sendstream: verifier: {PATH}; crc32c: {IMPLEMENTATION}", err=True)
    if scan:
        headers = list(find_headers(stream))
        for offset, version in headers:
            valid = "" if 1 <= version <= MAX_VERSION else " (not a valid version)"
            click.echo(f"offset {offset}: stream header, version {version}{valid}")
        if not quiet:
            click.echo(f"{len(headers)} stream header{'s' * (len(headers) != 1)}")
        return
    if address:
        from .net.receiving import verify_from_socket

        listening = listen.listening(address, tls, tls.key())
        report = verify_from_socket(
            listening, warn=warner(), log=logger(verbose), keep_going=keep_going, max_command_size=max_command_size
        )
    else:
        from .ops.verify import verify as verify_input

        report = verify_input(stream, keep_going=keep_going, max_command_size=max_command_size)
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
    max_command_size: int | None,
) -> None:
    """Rewrite stream IN into OUT (- for stdin/stdout) through the writer.

    With no options the output is byte-identical to a valid input. A file
    OUT appears only when the whole input was read without error.
    """
    if to_version is None and (max_zero_fill is not None or max_names is not None):
        raise click.UsageError("--max-zero-fill and --max-names go with --to-version 1")
    from .ops.convert import convert as write_converted

    limits = given(max_zero_fill=max_zero_fill, max_names=max_names)
    write_converted(source, target, to_version=to_version, max_command_size=max_command_size, warn=warn, **limits)


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
    from .render.changes import write_changes

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
    from .render.changes import write_changes

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
    from .ops.repair import repair as write_repaired
    from .ops.repair import summary_lines

    healer = write_repaired(source, target, keep_last=keep_last, max_command_size=max_command_size, warn=warn)
    if not quiet:
        click.echo("\n".join(f"sendstream: {line}" for line in summary_lines(healer)), err=True)


@cli.command()
@to_option
@stream_argument
@tls_options()
@sender_options
@send_options
@click.option(
    "--list", "listing", is_flag=True, help="Send nothing: list the snapshots a sendstream serve holds for us."
)
@json_option("snapshot (with --list)")
@progress_options
@verbose_option("Say which TLS path each direction uses (with why kTLS is off), and every reconnect.")
def send(
    target: str,
    stream: str,
    tls: TlsOptions,
    sending: SenderOptions,
    token: str | None,
    no_status: bool,
    read_ahead: int,
    listing: bool,
    as_json: bool,
    show: ProgressOptions,
    verbose: bool,
) -> None:
    """Check, heal and send STREAM (a file or -, e.g. from `btrfs send`) to HOST:PORT.

    With --resumable the transfer survives dropped connections: the sender
    reconnects and continues from the last command the receiver verified.
    Without it the plain stream goes through TLS, which any TLS-PSK peer
    (stunnel, openssl) can take, at full speed.

    With --resume TOKEN (printed by a receiver that stopped) STREAM is the
    same stream again, e.g. a new `btrfs send` of the same snapshot: it is
    checked against the token up to the token's offset, and only the rest
    is sent.

    With --list nothing is sent: a `sendstream serve` says which snapshots
    it holds for this client (its own only), to pick the next parent from.
    """
    from .net.sending import send as send_stream

    if listing:
        _list_held(target, tls, sending, as_json, logger(verbose))
        return
    if no_status and (sending.resumable or token):
        raise e.UsageError("--no-status is for a receiver that is not sendstream; a session needs sendstream")
    key = tls.key()
    checkpoint = None
    if token is not None:
        from .ops.tokens import read_token

        checkpoint = read_token(token, key)

    log = logger(verbose)
    connect = sending.connector(target, tls, key, log)
    with open_input(stream) as source:
        summary = send_stream(
            source,
            connect,
            show.progress("sent"),
            resume=checkpoint,
            expect_status=not no_status,
            log=log,
            read_ahead=read_ahead,
            **sending.retrying(),
        )
    if not show.quiet:
        click.echo(f"sendstream: {sending.noted(summary).line('sent', verbose=verbose)}", err=True)


@cli.command()
@output_options
@tls_options()
@listen_options(reconnect=True)
@resume_option
@progress_options
@verbose_option("Say which TLS path each direction uses (with why kTLS is off), and every reconnect.")
def receive(
    address: str,
    output: str | None,
    command: str | None,
    tls: TlsOptions,
    listen: ListenOptions,
    resume: bool,
    show: ProgressOptions,
    verbose: bool,
) -> None:
    """Accept one sender, check every command, and write only checked ones
    to stdout, a file or the stdin of CMD (e.g. 'btrfs receive DIR').

    When the connection drops the sender may reconnect: the output (or CMD)
    carries on where the last verified command ended. A resumable sender's
    stream goes to FILE.part, made durable at checkpoints (FILE.part.resume
    holds a resume token); if either side stops, `receive --resume` and
    `send --resume TOKEN` continue from the last checkpoint.
    """
    import signal

    from .net import receiving
    from .net.sinks import Target
    from .ops.tokens import make_token

    target = Target(output, command, encrypted=tls.mode != "none", resume=resume)
    key = tls.key()
    checkpoint = target.start(key)
    if checkpoint is not None and key is not None:
        click.echo(
            f"sendstream: resuming {output} at offset {checkpoint.offset}; on the sending side run\n"
            f"  sendstream send --resume {make_token(checkpoint, key)} ...",
            err=True,
        )

    def journaling() -> None:
        # SIGTERM ends the transfer like an error: the token is printed, the journal kept
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    progress = show.progress("received")
    above = progress.above if progress.mode == "bar" else None  # a child's `At subvol` goes above the bar

    def sink(session: SessionReceiver) -> Sink:
        return target.sink(session.raw, key, checkpoint, notify=logger(True), journaling=journaling, child_stderr=above)

    listening = listen.listening(address, tls, key)
    summary = receiving.receive(listening, sink, progress, warn=warner(), log=logger(verbose), resume=checkpoint)
    if not show.quiet:
        click.echo(f"sendstream: {summary.line('received', verbose=verbose)}", err=True)


@cli.command()
@relay_listen_option
@to_option
@tls_options("listen", " of the sender's leg")
@tls_options("to", " of the receiver's leg")
@sender_options
@reconnect_timeout_option
@idle_timeout_option
@progress_options
@verbose_option("Say which TLS path each leg uses (with why kTLS is off), and every reconnect.")
def relay(
    address: str,
    target: str,
    listen_tls: TlsOptions,
    to_tls: TlsOptions,
    sending: SenderOptions,
    reconnect_timeout: float,
    idle_timeout: float,
    show: ProgressOptions,
    verbose: bool,
) -> None:
    """Accept one sender on --listen and send its stream on to --to, checking and
    healing every command in between.

    Each leg has its own TLS mode, key and identity: re-encrypt, change the
    mode, rotate keys. The sender's leg takes what `receive` takes (a
    `send --resumable` reconnects into the relay after a drop); the other
    leg sends as `send` does (--resumable, --retries, --retry-delay,
    --timeout, which also bounds the sender's handshake and hello). The sender hears
    success only once the receiver reported it, and the receiver's failure
    otherwise.
    """
    from .net import relay as relaying

    listen_key, to_key = listen_tls.key(), to_tls.key()
    log = logger(verbose, "downstream: ")
    connect = sending.connector(target, to_tls, to_key, log)
    listen = ListenOptions(sending.timeout, idle_timeout, reconnect_timeout)
    summary = relaying.relay(
        listen.listening(address, listen_tls, listen_key),
        connect,
        show.progress("relayed"),
        warn=warner("upstream: "),
        upstream_log=logger(verbose, "upstream: "),
        log=log,
        **sending.retrying(),
    )
    if not show.quiet:
        click.echo(f"sendstream: {sending.noted(summary).line('relayed', verbose=verbose)}", err=True)


@cli.command()
@click.argument("stream", type=click.Path(dir_okay=False, allow_dash=True))
@click.argument("directory", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@extract_options
@max_size_option
def extract(stream: str, directory: str, clone_from: tuple[str, ...], quiet: bool, **options: Any) -> None:
    """Apply STREAM (a file or -) to DIR in user space, without btrfs.

    A full stream needs an empty DIR, which becomes the subvolume; an
    incremental one is applied in place onto a DIR that holds the extraction
    of its parent. Nothing is ever written outside DIR: paths with '..',
    absolute paths and paths through symlinks are refused. Commands that
    cannot apply here (fileattr, --no-data extents, xattrs or devices the
    file system or user may not have) are skipped with a warning.
    """
    from .extract import extract_stream, parse_clone_from

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
    from .render.paths import write_paths

    write_paths(stream, sys.stdout.buffer, warn=warn, **given(**options))


@cli.command()
@stream_argument
@max_size_option
def stats(stream: str, **options: Any) -> None:
    """Count commands and bytes per command kind in each stream of STREAM (a file or -)."""
    from .render.paths import write_stats

    write_stats(stream, sys.stdout.buffer, warn=warn, **given(**options))


@cli.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="The service's TOML file: where to listen, and each client's identity, key and place (see README).",
)
@click.option("--check-config", is_flag=True, help="Check FILE (keys, places, names) and say what is wrong, then exit.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="One line per event on stderr: key=value text, or JSON lines.",
)
@click.option(
    "--metrics",
    metavar="HOST:PORT",
    help="Answer Prometheus scrapes on HOST:PORT (needs prometheus_client): transfers, bytes, active ones, "
    "the last success of each subvolume.",
)
def serve(config_path: str, check_config: bool, log_format: str, metrics: str | None) -> None:
    """Receive streams from many clients at once, each authenticated by its key
    and stored in its own place, until SIGTERM or Ctrl-C.

    A client with a wrong key, one that sends garbage or nothing, a damaged
    stream: each ends its own connection, with a logged reason and a status
    to the sender, and the service goes on. A stream is stored whole and
    checked, named by its subvolume UUID and ctransid (and its parent's),
    with a JSON manifest beside it.
    """
    import signal
    import threading

    from .service import config as configuration
    from .service.server import EventLog, Service

    config = configuration.load(config_path, warn=warn)
    if check_config:
        click.echo(
            f"{config_path}: ok: {len(config.clients)} client{'s' * (len(config.clients) != 1)} "
            f"({', '.join(sorted(config.clients))}), {config.tls} on {config.listen.host}:{config.listen.port}"
        )
        return
    stop = threading.Event()

    def stopping(signum: int, frame: object) -> None:
        stop.set()  # a second signal ends the process at once
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    log = EventLog(sys.stderr, log_format)
    counted = None
    if metrics is not None:
        from .net.address import Address
        from .service.metrics import Metrics

        counted = Metrics()
        address = Address.parse(metrics, listen=True)
        log("metrics", address=f"{address.host}:{counted.serve(address)}")
    try:
        Service(config, log, counted).run(stop)
    finally:
        if counted is not None:
            counted.close()


def _list_held(
    target: str, tls: TlsOptions, sending: SenderOptions, as_json: bool, log: Callable[[str], object]
) -> None:
    import json

    from .net.sending import list_held

    for s in list_held(sending.connector(target, tls, tls.key(), log)):
        if as_json:
            click.echo(json.dumps(s, sort_keys=True))
            continue
        parent = f"from {s.get('parent_uuid')}.{s.get('parent_ctransid')}" if s.get("parent_uuid") else "full"
        click.echo(f"{s.get('uuid')}.{s.get('ctransid')} {parent} {s.get('name')}")


cli.add_command(key)
cli.add_command(man)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and map every error to its exit code, in one place."""
    return run_command(cli, argv)
