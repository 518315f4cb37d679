"""The command line: a thin layer over the library.

Errors become exit codes in one place (:func:`main`); see the README's
table of exit codes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, BinaryIO

import click

from . import __version__
from . import errors as e
from .codec.crc import IMPLEMENTATION
from .codec.limits import MAX_COMMAND_SIZE
from .codec.native import PATH
from .format.layout import MAX_VERSION
from .io.framed import tell_problems
from .io.outputs import is_special
from .io.windows import open_input
from .net import tls
from .ops.verify import Report, find_headers

if TYPE_CHECKING:
    from .net.address import Listening
    from .net.progress import Progress
    from .net.session.receiver import SessionReceiver
    from .net.sinks import Sink
    from .net.tls import Channel

# Modules that only some commands need (network, extraction, paths, dump,
# repair, the writer, subprocess) load when those commands run: imported
# up front they would double the start-up time of every command. The TLS
# package is light until a connection loads its library (see net.tls.connect).


def _options(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Several decorators as one, in the order they are written (the top one first, as when stacked)."""

    def decorate(f: Any) -> Any:
        for option in reversed(decorators):
            f = option(f)
        return f

    return decorate


def _given(**options: Any) -> dict[str, Any]:
    """The options given, by the names of the library's arguments: for the others (None) its defaults stand."""
    return {name: value for name, value in options.items() if value is not None}


def _json_option(one_per: str) -> Callable[[Any], Any]:
    return click.option("--json", "as_json", is_flag=True, help=f"JSON lines: one object per {one_per}.")


_stream_argument = click.argument("stream", default="-")
_in_out_arguments = _options(click.argument("source", metavar="IN"), click.argument("target", metavar="OUT"))
_summary_option = click.option("-q", "--quiet", is_flag=True, help="No summary line.")
_max_size_option = click.option(
    "--max-command-size",
    type=click.IntRange(min=1, max=MAX_COMMAND_SIZE),
    metavar="BYTES",
    help="Largest command payload accepted (default: the kernel's limit for the stream's version; "
    f"at most {MAX_COMMAND_SIZE >> 20} MiB, which one command may take in memory).",
)
# for the commands that follow names to the end of a subvolume
_tracker_options = _options(
    click.option(
        "--max-names",
        type=click.IntRange(min=1),
        metavar="N",
        help="Most names followed in one subvolume; every directory above a path counts (default: 400,000).",
    ),
    click.option(
        "--max-held",
        type=click.IntRange(min=1),
        metavar="BYTES",
        help="Most bytes of results held until a subvolume ends: records, changes, their paths (default: 64 MiB).",
    ),
)


def _tls_options(leg: str = "", of: str = "") -> Callable[[Any], Any]:
    """--tls, --key and --identity; for a leg of a relay --LEG-tls, --LEG-key and --LEG-identity
    (parameters LEG_mode, LEG_key_file, LEG_identity), whose help ends with ``of``."""
    flag, name = (f"--{leg}-", f"{leg}_") if leg else ("--", "")

    def decorate(f: Any) -> Any:
        f = click.option(
            f"{flag}identity",
            f"{name}identity",
            default="sendstream",
            show_default=True,
            help=f"Name of the pre-shared key{of}.",
        )(f)
        f = click.option(
            f"{flag}key",
            f"{name}key_file",
            type=click.Path(dir_okay=False),
            help=f"Pre-shared key file{of} (PEM, else raw bytes); without it, a password is asked on the terminal.",
        )(f)
        return click.option(
            f"{flag}tls",
            f"{name}mode",
            type=click.Choice(tls.MODES),
            default=tls.DEFAULT_MODE,
            show_default=True,
            help=f"TLS version and cipher{of}; 'none' is raw TCP (only when asked).",
        )(f)

    return decorate


def _sender_options(f: Any) -> Any:
    """--retries, --retry-delay, --timeout and --resumable of a sending end."""
    f = click.option(
        "--resumable",
        is_flag=True,
        help="Run a session that survives dropped connections (needs a sendstream receiver; ~30% slower).",
    )(f)
    f = click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=60.0,
        show_default=True,
        metavar="SECONDS",
        help="A connection that makes no progress this long counts as dropped.",
    )(f)
    f = click.option(
        "--retry-delay",
        type=click.FloatRange(min=0),
        default=1.0,
        show_default=True,
        metavar="SECONDS",
        help="Wait before the second attempt; doubles with each further one (at most 30 s).",
    )(f)
    return click.option(
        "--retries",
        type=click.IntRange(min=0),
        default=5,
        show_default=True,
        help="Connection attempts after a drop (or before the first connection), per outage.",
    )(f)


IDLE_TIMEOUT = 600.0


def _idle_timeout_option(f: Any) -> Any:
    return click.option(
        "--idle-timeout",
        type=click.FloatRange(min=0),
        default=IDLE_TIMEOUT,
        show_default=True,
        metavar="SECONDS",
        help="Once a sender said hello, the longest wait for its next byte (0: for ever); "
        "it covers `btrfs send -p` computing before it writes (see README).",
    )(f)


def _listen_timeout_options(default: float) -> Callable[[Any], Any]:
    """--timeout (a new connection's handshake and hello) and --idle-timeout of a listening end."""

    def decorate(f: Any) -> Any:
        f = _idle_timeout_option(f)
        return click.option(
            "--timeout",
            type=click.FloatRange(min=0.1),
            default=default,
            show_default=True,
            metavar="SECONDS",
            help="Longest a new connection may take for its TLS handshake and hello, all of it together; "
            "a connection that does not make it is refused and the wait goes on.",
        )(f)

    return decorate


def _reconnect_timeout_option(f: Any) -> Any:
    return click.option(
        "--reconnect-timeout",
        type=click.FloatRange(min=0),
        default=300.0,
        show_default=True,
        metavar="SECONDS",
        help="After a drop, how long to wait for the sender to come back.",
    )(f)


class _ReaderGone(Exception):
    """Standard output's reader went away (``| head``): not an error of ours."""


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        # click turns EPIPE into exit 1 on its own; every command of ours ends quietly with 0
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise _ReaderGone() from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sendstream")
@click.option("--traceback", "show_traceback", is_flag=True, help="Show a Python traceback on errors.")
@click.pass_context
def cli(ctx: click.Context, show_traceback: bool) -> None:
    """Read, check, convert and move btrfs send streams."""
    ctx.obj = {"traceback": show_traceback}


def _warn(message: str) -> None:
    click.echo(f"sendstream: warning: {message}", err=True)


def _error(message: str) -> None:
    click.echo(f"sendstream: error: {message}", err=True)


@cli.command()
@_stream_argument
@_json_option("command")
@click.option("--strict", is_flag=True, help="Reject commands and attributes unknown to the stream's version.")
@_max_size_option
def dump(stream: str, **options: Any) -> None:
    """Print every command of STREAM (a file or -), like `btrfs receive --dump`."""
    from .render.dump import dump as write_dump

    write_dump(stream, sys.stdout.buffer, warn=_warn, **_given(**options))


@cli.command()
@_stream_argument
@click.option("--keep-going", is_flag=True, help="Report every problem, not only the first.")
@click.option("--scan", is_flag=True, help="Only list every stream header in STREAM, wherever it is.")
@click.option("--from-socket", "address", metavar="HOST:PORT", help="Listen there and verify what one sender sends.")
@_tls_options()
@_listen_timeout_options(30.0)
@_summary_option
@click.option("-v", "--verbose", is_flag=True, help="Say which verifier and CRC implementation ran.")
@_max_size_option
def verify(
    stream: str,
    keep_going: bool,
    scan: bool,
    address: str | None,
    mode: str,
    key_file: str | None,
    identity: str,
    timeout: float,
    idle_timeout: float,
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
        report = _verify_from_socket(
            address, mode, key_file, identity, timeout, idle_timeout, keep_going, max_command_size, verbose
        )
    else:
        from .ops.verify import verify as verify_input

        report = verify_input(stream, keep_going=keep_going, max_command_size=max_command_size)
    tell_problems(report.problems, _error)
    tell_problems(report.warnings, _warn)
    if not quiet:
        click.echo(report.summary())
    sys.exit(report.exit_code)


@cli.command()
@_in_out_arguments
@click.option(
    "--to-version",
    type=click.IntRange(1, 1),
    metavar="1",
    help="Write a v1 stream for an older btrfs receive: ENCODED_WRITE decompressed into WRITEs, "
    "FALLOCATE as WRITEs of zeros, FILEATTR and ENABLE_VERITY dropped with a warning.",
)
@click.option(
    "--max-zero-fill",
    type=click.IntRange(min=0),
    metavar="BYTES",
    help="With --to-version 1: most bytes of zeros written for holes in all (default: 1 GiB).",
)
@click.option(
    "--max-names",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="With --to-version 1: most names followed in one subvolume to know file sizes (default: 400,000).",
)
@_max_size_option
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

    limits = _given(max_zero_fill=max_zero_fill, max_names=max_names)
    write_converted(source, target, to_version=to_version, max_command_size=max_command_size, warn=_warn, **limits)


@cli.command(name="ls")
@_stream_argument
@_json_option("subvolume")
@_tracker_options
@_max_size_option
def ls_command(stream: str, **options: Any) -> None:
    """List every path STREAM (a file or -) touches, with the kind of change.

    One line per name, under its final path: created, linked (a new hard
    link, `to` another name), deleted, renamed (`from` the old path),
    modified (data) or metadata, then [data mode,owner,times,xattrs,...].
    btrfs' temporary names never show: a file created as o257-5-0 and
    renamed into place is `created` at its final path.
    """
    from .render.changes import write_changes

    write_changes(stream, sys.stdout.buffer, warn=_warn, **_given(**options))


@cli.command()
@_stream_argument
@_json_option("subvolume")
@_tracker_options
@_max_size_option
def diff(stream: str, **options: Any) -> None:
    """What the incremental STREAM (a file or -) changes against its parent.

    Text, as `git diff --name-status`: A added (a new hard link says to
    what), D removed, R old -> new (renamed or moved; swaps and the btrfs
    LINK + UNLINK form included), M data modified, m metadata only; then
    [data mode,owner,times,xattrs,fileattr]. --json: added, removed,
    renamed (from, to), modified, metadata.
    """
    from .render.changes import write_changes

    write_changes(stream, sys.stdout.buffer, diff=True, warn=_warn, **_given(**options))


def _verify_from_socket(
    address: str,
    mode: str,
    key_file: str | None,
    identity: str,
    timeout: float,
    idle_timeout: float,
    keep_going: bool,
    max_command_size: int | None,
    verbose: bool,
) -> Report:
    from .net.receiving import verify_from_socket

    listening = _listening(address, mode, _psk(mode, key_file, identity), identity, timeout, idle_timeout)
    return verify_from_socket(
        listening, warn=_warner(), log=_logger(verbose), keep_going=keep_going, max_command_size=max_command_size
    )


def _listening(
    address: str,
    mode: str,
    key: bytes | None,
    identity: str,
    timeout: float,
    idle_timeout: float,
    reconnect_timeout: float | None = None,
) -> Listening:
    """How --listen takes its sender (an --idle-timeout of 0 waits for ever)."""
    from .net.address import Address, Listening, TlsSettings

    return Listening(
        Address.parse(address, listen=True),
        TlsSettings(mode, key, identity),
        timeout,
        idle_timeout or None,
        reconnect_timeout,
    )


@cli.command()
@_in_out_arguments
@click.option("--keep-last", is_flag=True, help="Keep only what follows the last restart (OUT must be seekable).")
@_summary_option
@_max_size_option
def repair(source: str, target: str, keep_last: bool, quiet: bool, max_command_size: int | None) -> None:
    """Write the clean stream of IN (a restarted `btrfs send`) to OUT (- for stdin/stdout).

    Each command goes out only after its CRC is checked. After a restart the
    replayed commands must match those already written (length and CRC);
    they are dropped with the partial command before the restart. A file OUT
    appears only when the whole input was repaired.
    """
    from .ops.repair import repair as write_repaired
    from .ops.repair import summary_lines

    healer = write_repaired(source, target, keep_last=keep_last, max_command_size=max_command_size, warn=_warn)
    if not quiet:
        click.echo("\n".join(f"sendstream: {line}" for line in summary_lines(healer)), err=True)


def _psk(mode: str, key_file: str | None, identity: str, leg: str = "") -> bytes | None:
    """The key of ``--tls``/``--key``/``--identity`` (of a relay's ``leg``): the file, else a password asked."""
    import getpass

    from .net.tls import derive_key, load_key

    flag = f"--{leg}-" if leg else "--"
    if mode == "none":
        click.echo(f"sendstream: warning: {flag}tls none: the stream crosses the network unencrypted", err=True)
        return None
    if key_file:
        return load_key(key_file)
    # getpass asks on /dev/tty, else on standard input if it is a terminal, else it would read
    # standard input (the stream itself, under cron) as the password
    if not sys.stdin.isatty():
        try:
            os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
        except OSError:
            raise e.UsageError(
                f"no {flag}key given, and no terminal to ask for a password: give {flag}key FILE"
            ) from None
    return derive_key(getpass.getpass(f"password for {identity!r}{f' (--{leg})' if leg else ''}: "), identity)


def _logger(verbose: bool, prefix: str = "") -> Callable[[str], object]:
    """Where -v messages go: stderr, after ``prefix`` (a relay's leg); nowhere without -v."""

    def log(text: str) -> None:
        if verbose:
            click.echo(f"sendstream: {prefix}{text}", err=True)

    return log


def _warner(prefix: str = "") -> Callable[[str], object]:
    """Where warnings go: stderr always (a refused connection is a security event), after ``prefix``."""

    def warn(text: str) -> None:
        click.echo(f"sendstream: warning: {prefix}{text}", err=True)

    return warn


def _connector(
    target: str, mode: str, key: bytes | None, identity: str, timeout: float, log: Callable[[str], object]
) -> Callable[[], Channel]:
    """A new channel to --to on every call; the first is described to ``log``."""
    from .net.address import Address, Dialing, TlsSettings
    from .net.sending import connector

    return connector(Dialing(Address.parse(target), TlsSettings(mode, key, identity), timeout), log)


def _quiet_progress(label: str, quiet: bool) -> Progress:
    from .net.progress import Progress

    return Progress(label, enabled=False if quiet else None)


@cli.command()
@click.option("--to", "target", required=True, metavar="HOST:PORT", help="Where a `sendstream receive` listens.")
@click.argument("stream", default="-")
@_tls_options()
@_sender_options
@click.option(
    "--resume",
    "token",
    metavar="TOKEN",
    help="Continue a transfer after a restart, from the receiver's token (implies --resumable).",
)
@click.option(
    "--no-status",
    is_flag=True,
    help="The receiver is not sendstream (stunnel, socat, openssl): count the stream as delivered once it is "
    "sent and closed, without the receiver's status.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary.")
@click.option("-v", "--verbose", is_flag=True, help="Say which TLS path each direction uses, and every reconnect.")
def send(
    target: str,
    stream: str,
    mode: str,
    key_file: str | None,
    identity: str,
    retries: int,
    retry_delay: float,
    timeout: float,
    resumable: bool,
    token: str | None,
    no_status: bool,
    quiet: bool,
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
    """
    from .net import sending

    if no_status and (resumable or token):
        raise e.UsageError("--no-status is for a receiver that is not sendstream; a session needs sendstream")
    key = _psk(mode, key_file, identity)
    checkpoint = None
    if token is not None:
        from .ops.tokens import read_token

        checkpoint = read_token(token, key)

    log = _logger(verbose)
    connect = _connector(target, mode, key, identity, timeout, log)
    with open_input(stream) as source:
        summary = sending.send(
            source,
            connect,
            _quiet_progress("sent", quiet),
            resumable=resumable,
            resume=checkpoint,
            expect_status=not no_status,
            retries=retries,
            retry_delay=retry_delay,
            log=log,
        )
    if not quiet:
        click.echo(f"sendstream: {summary.line('sent')}", err=True)


@cli.command()
@click.option("--listen", "address", required=True, metavar="HOST:PORT", help="Address to listen on ('*:PORT': all).")
@click.option("-o", "--output", default=None, metavar="FILE", help="Write the stream to FILE (- for stdout).")
@click.option("--exec", "command", default=None, metavar="CMD", help="Write the stream to the stdin of CMD.")
@_tls_options()
@_reconnect_timeout_option
@_listen_timeout_options(30.0)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the unfinished transfer to FILE (-o) where its last durable command ended.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary.")
@click.option("-v", "--verbose", is_flag=True, help="Say which TLS path each direction uses, and every reconnect.")
def receive(
    address: str,
    output: str | None,
    command: str | None,
    mode: str,
    key_file: str | None,
    identity: str,
    reconnect_timeout: float,
    timeout: float,
    idle_timeout: float,
    resume: bool,
    quiet: bool,
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
    from .net.journal import load_state, refuse_unfinished
    from .net.sinks import ChildSink, FileSink, JournalSink
    from .ops.tokens import make_token

    if output and command:
        raise e.UsageError("give -o or --exec, not both")
    journaled = bool(output) and output != "-" and mode != "none" and not is_special(output or "")
    if resume and not journaled:
        raise e.UsageError("--resume continues a file: give -o FILE and a TLS mode (its key signs the token)")
    key = _psk(mode, key_file, identity)
    checkpoint = None
    if resume:
        assert output
        checkpoint = load_state(output, key)
        assert key is not None  # load_state needs one
        click.echo(
            f"sendstream: resuming {output} at offset {checkpoint.offset}; on the sending side run\n"
            f"  sendstream send --resume {make_token(checkpoint, key)} ...",
            err=True,
        )
    elif journaled:
        assert output
        refuse_unfinished(output)

    def sink(session: SessionReceiver) -> Sink:
        if command:
            return ChildSink(command)
        if journaled and not session.raw:  # a raw stream has no identity to keep a journal of
            assert output and key
            # SIGTERM ends the transfer like an error: the token is printed, the journal kept
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
            return JournalSink(output, key, checkpoint, notify=_logger(verbose=True))
        return FileSink(output or "-")

    listening = _listening(address, mode, key, identity, timeout, idle_timeout, reconnect_timeout)
    progress = _quiet_progress("received", quiet)
    summary = receiving.receive(listening, sink, progress, warn=_warner(), log=_logger(verbose), resume=checkpoint)
    if not quiet:
        click.echo(f"sendstream: {summary.line('received')}", err=True)


@cli.command()
@click.option(
    "--listen", "address", required=True, metavar="HOST:PORT", help="Where the sender connects ('*:PORT': all)."
)
@click.option("--to", "target", required=True, metavar="HOST:PORT", help="Where a `sendstream receive` listens.")
@_tls_options("listen", " of the sender's leg")
@_tls_options("to", " of the receiver's leg")
@_sender_options
@_reconnect_timeout_option
@_idle_timeout_option
@click.option("-q", "--quiet", is_flag=True, help="No progress and no summary.")
@click.option("-v", "--verbose", is_flag=True, help="Say which TLS path each leg uses, and every reconnect.")
def relay(
    address: str,
    target: str,
    listen_mode: str,
    listen_key_file: str | None,
    listen_identity: str,
    to_mode: str,
    to_key_file: str | None,
    to_identity: str,
    retries: int,
    retry_delay: float,
    timeout: float,
    resumable: bool,
    reconnect_timeout: float,
    idle_timeout: float,
    quiet: bool,
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

    listen_key = _psk(listen_mode, listen_key_file, listen_identity, "listen")
    to_key = _psk(to_mode, to_key_file, to_identity, "to")
    log = _logger(verbose, "downstream: ")
    connect = _connector(target, to_mode, to_key, to_identity, timeout, log)
    listening = _listening(address, listen_mode, listen_key, listen_identity, timeout, idle_timeout, reconnect_timeout)
    summary = relaying.relay(
        listening,
        connect,
        _quiet_progress("relayed", quiet),
        warn=_warner("upstream: "),
        upstream_log=_logger(verbose, "upstream: "),
        resumable=resumable,
        retries=retries,
        retry_delay=retry_delay,
        log=log,
    )
    if not quiet:
        click.echo(f"sendstream: {summary.line('relayed')}", err=True)


@cli.command()
@click.argument("stream")
@click.argument("directory", metavar="DIR", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--clone-from",
    "clone_from",
    multiple=True,
    metavar="[UUID=]DIR",
    help="A clone source: UUID=DIR is the extraction of subvolume UUID; a plain DIR holds such "
    "extractions in subdirectories named by UUID. Repeatable.",
)
@click.option(
    "--per-subvolume",
    is_flag=True,
    help="Put each subvolume in DIR/NAME, as btrfs receive does (for an input of several subvolumes); "
    "an incremental becomes DIR/NAME made from a copy of its parent, extracted before it or given "
    "with --clone-from.",
)
@click.option(
    "--max-clone-copy",
    type=click.IntRange(min=0),
    metavar="BYTES",
    help="Most bytes of data that clones (and copies of parents, with --per-subvolume) may copy in all "
    "where DIR's file system cannot reflink (default: 64 GiB).",
)
@click.option("-q", "--quiet", is_flag=True, help="No warnings about skipped commands and no summary.")
@_max_size_option
def extract(stream: str, directory: str, clone_from: tuple[str, ...], quiet: bool, **options: Any) -> None:
    """Apply STREAM (a file or -) to DIR in user space, without btrfs.

    A full stream needs an empty DIR, which becomes the subvolume; an
    incremental one is applied in place onto a DIR that holds the extraction
    of its parent. Nothing is ever written outside DIR: paths with '..',
    absolute paths and paths through symlinks are refused. Commands that
    cannot apply here (fileattr, --no-data extents, xattrs or devices the
    file system or user may not have) are skipped with a warning.
    """
    from .extract import extract as extract_stream
    from .extract import parse_clone_from

    sources, dirs = parse_clone_from(clone_from)
    report = extract_stream(stream, directory, clone_sources=sources, clone_dirs=dirs, warn=_warn, **_given(**options))
    if not quiet:
        for group in report.skip_groups():
            more = f" (and {group.count - 1} more {'of other kinds' if group.other else 'like it'})"
            _warn(f"skipped: {group.kept[0]}{more if group.count > 1 else ''}")
        click.echo(f"sendstream: {report.summary()}", err=True)


@cli.command()
@_stream_argument
@_json_option("command")
@_tracker_options
@_max_size_option
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

    write_paths(stream, sys.stdout.buffer, warn=_warn, **_given(**options))


@cli.command()
@_stream_argument
@_max_size_option
def stats(stream: str, **options: Any) -> None:
    """Count commands and bytes per command kind in each stream of STREAM (a file or -)."""
    from .render.paths import write_stats

    write_stats(stream, sys.stdout.buffer, warn=_warn, **_given(**options))


def _report(exc: BaseException, show_traceback: bool, err: IO[str]) -> None:
    if show_traceback:
        import traceback

        traceback.print_exc(file=err)
    print(f"sendstream: error: {exc}", file=err)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and map every error to its exit code, in one place."""
    show_traceback = "--traceback" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="sendstream", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return e.EXIT_USAGE
    except click.exceptions.Abort:
        print("Aborted!", file=sys.stderr)
        return 130
    except SystemExit as exc:
        return int(exc.code or 0)
    except (BrokenPipeError, _ReaderGone):
        _quiet_stdout()
        return 0
    except e.SendStreamError as exc:
        _report(exc, show_traceback, sys.stderr)
        return exc.exit_code
    except OSError as exc:
        _report(exc, show_traceback, sys.stderr)
        return e.EXIT_IO
    return 0


def _quiet_stdout() -> None:
    # The reader went away (`| head`): drop what is left instead of a second error at exit.
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


_: BinaryIO
