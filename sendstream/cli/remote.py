"""The commands that move streams between machines: ``send``, ``receive`` and ``relay``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .. import errors as e
from ..io.windows import open_input
from .admin import list_held
from .options import (
    ListenOptions,
    ProgressOptions,
    SenderOptions,
    TlsOptions,
    change_sealing_option,
    encrypt_key_option,
    endpoint_option,
    idle_timeout_option,
    listen_options,
    output_options,
    progress_options,
    reconnect_timeout_option,
    relay_listen_option,
    resume_option,
    send_options,
    send_to_option,
    sender_options,
    stream_argument,
    tls_options,
    to_option,
    verbose_option,
)
from .terminal import Group, logger, warner

if TYPE_CHECKING:
    from ..session.receiver import SessionReceiver
    from ..transfer.sinks import Sink


@click.command(cls=Group.command_class)
@send_to_option
@stream_argument
@tls_options()
@sender_options
@send_options
@progress_options
@endpoint_option
@encrypt_key_option
@change_sealing_option
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
    endpoint_url: str | None,
    encrypt_key: str | None,
    change_sealing: bool,
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

    To s3://BUCKET/PREFIX the stream is archived in object storage, named by
    what it is, in parts that end on command boundaries, with its manifest
    (`sendstream archive ls`, `restore`, `verify s3://...`).

    With --list nothing is sent: a `sendstream serve` says which snapshots
    it holds for this client (its own only), to pick the next parent from.
    """
    from ..endpoints.sending import send as send_stream
    from ..stores import at

    if (store := at(target, endpoint_url)) is not None:
        from .archive import send_to_store

        send_to_store(store, stream, tls.key_file, encrypt_key, sending.retrying(), show, change_sealing)
        return
    if encrypt_key is not None:
        raise e.UsageError("--encrypt-key is for s3://: a transfer is encrypted by TLS")
    if change_sealing:
        raise e.UsageError("--change-sealing is for s3://")
    if listing:
        list_held(sending.connector(target, tls, tls.key(), logger(verbose)), as_json)
        return
    if no_status and (sending.resumable or token):
        raise e.UsageError("--no-status is for a receiver that is not sendstream; a session needs sendstream")
    key = tls.key()
    checkpoint = None
    if token is not None:
        from ..transfer.tokens import read_token

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
        said = summary.status.partition(" ")[2]  # "0 ok", or what else a receiver has to say (already stored)
        if said not in ("", "ok"):
            click.echo(f"sendstream: the receiver says: {said}", err=True)


@click.command(cls=Group.command_class)
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

    from ..endpoints import receiving
    from ..transfer.sinks import Target
    from ..transfer.tokens import make_token

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
    summary = receiving.receive(
        listening, sink, progress, warn=warner(), log=logger(verbose), resume=checkpoint, announce=logger(True)
    )
    if not show.quiet:
        click.echo(f"sendstream: {summary.line('received', verbose=verbose)}", err=True)


@click.command(cls=Group.command_class)
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
    from ..endpoints import relay as relaying

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
        announce=logger(True),
        **sending.retrying(),
    )
    if not show.quiet:
        click.echo(f"sendstream: {sending.noted(summary).line('relayed', verbose=verbose)}", err=True)
