"""The command line's options, each declared once, and what they become for the library.

Options that always go together arrive in a command as one value: the TLS
settings of an end (:class:`TlsOptions`), how a sending end retries
(:class:`SenderOptions`), how a listening end waits (:class:`ListenOptions`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from ..codec.limits import MAX_COMMAND_SIZE
from ..render.progs import DEFAULT_STYLE, PROGS_STYLES, matches
from ..transport import tls
from .params import ByteSize, Compression
from .terminal import psk

if TYPE_CHECKING:
    from ..transfer.progress import Progress, Summary
    from ..transport.address import Listening, TlsSettings
    from ..transport.compression import Tally
    from ..transport.tls import Channel

Decorator = Callable[[Any], Any]


def options(*decorators: Decorator) -> Decorator:
    """Several decorators as one, in the order they are written (the top one first, as when stacked)."""

    def decorate(f: Any) -> Any:
        for option in reversed(decorators):
            f = option(f)
        return f

    return decorate


def given(**values: Any) -> dict[str, Any]:
    """The options given, by the names of the library's arguments: for the others (None) its defaults stand."""
    return {name: value for name, value in values.items() if value is not None}


def grouped(into: str, make: Callable[..., Any], names: tuple[str, ...], *declared: Decorator) -> Decorator:
    """Declare the options ``declared``, and hand the command ``make(*their values)`` as ``into`` instead."""

    def decorate(f: Any) -> Any:
        @functools.wraps(f)
        def command(**kwargs: Any) -> Any:
            kwargs[into] = make(*(kwargs.pop(name) for name in names))
            return f(**kwargs)

        return options(*declared)(command)

    return decorate


def json_option(one_per: str) -> Decorator:
    return click.option("--json", "as_json", is_flag=True, help=f"JSON lines: one object per {one_per}.")


progs_style_option = click.option(
    "--progs-style",
    "style",
    type=click.Choice(PROGS_STYLES),
    default=DEFAULT_STYLE,
    show_default=True,
    help="Whose `receive --dump` text: " + "; ".join(f"{s} is that of {matches(s)}" for s in PROGS_STYLES) + ".",
)


def verbose_option(what: str) -> Decorator:
    return click.option("-v", "--verbose", is_flag=True, help=what)


# a file name or -: typed as a path so that shell completion offers file names
STREAM_PATH = click.Path(dir_okay=False, allow_dash=True)
stream_argument = click.argument("stream", default="-", type=STREAM_PATH)
# verify's: a stream file, -, s3://BUCKET/PREFIX or a directory (a service's file place)
stream_or_place_argument = click.argument("stream", default="-", type=click.Path(allow_dash=True))
in_out_arguments = options(
    click.argument("source", metavar="IN", type=STREAM_PATH), click.argument("target", metavar="OUT", type=STREAM_PATH)
)
summary_option = click.option("-q", "--quiet", is_flag=True, help="No summary line.")

# s3:// (send --to, verify, restore, archive)
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


def _progress_mode(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, float]:
    from ..transfer.progress import parse_mode

    try:
        return parse_mode(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@dataclasses.dataclass(frozen=True)
class ProgressOptions:
    """What a transfer shows: nothing and no summary (``quiet``), else the progress in ``mode``."""

    quiet: bool
    mode: tuple[str, float]
    total: int | None

    def progress(self, label: str) -> Progress:
        from ..transfer.progress import NONE, Progress

        name, every = self.mode
        return Progress(label, mode=NONE if self.quiet else name, every=every, total=self.total)


progress_options = grouped(
    "show",
    ProgressOptions,
    ("quiet", "progress_mode", "total"),
    click.option("-q", "--quiet", is_flag=True, help="No progress and no summary."),
    click.option(
        "--progress",
        "progress_mode",
        default="auto",
        show_default=True,
        metavar="auto|bar|plain[:SECONDS]|none",
        callback=_progress_mode,
        help="bar: one line redrawn on the terminal (auto: when stderr is one); plain: a line every "
        "SECONDS (10) for logs.",
    ),
    click.option(
        "--size",
        "total",
        type=ByteSize(),
        metavar="BYTES",
        help="The stream's size, for the percentage and ETA when it is not a file (e.g. 12G, from the "
        "last transfer's summary or du of the snapshot).",
    ),
)
to_option = click.option(
    "--to", "target", required=True, metavar="HOST:PORT", help="Where a `sendstream receive` listens."
)
send_to_option = click.option(
    "--to",
    "target",
    required=True,
    metavar="HOST:PORT|s3://BUCKET/PREFIX",
    help="Where a `sendstream receive` or `serve` listens, or an archive in object storage.",
)
send_options = options(
    click.option(
        "--resume",
        "token",
        metavar="TOKEN",
        help="Continue a transfer after a restart, from the receiver's token (implies --resumable).",
    ),
    click.option(
        "--no-status",
        is_flag=True,
        help="The receiver is not sendstream (stunnel, socat, openssl): count the stream as delivered once it "
        "is sent and closed, without the receiver's status.",
    ),
    click.option(
        "--list", "listing", is_flag=True, help="Send nothing: list the snapshots a sendstream serve holds for us."
    ),
    json_option("snapshot (with --list)"),
    click.option(
        "--buffer",
        "read_ahead",
        type=ByteSize(minimum=1),
        default=0,
        metavar="SIZE",
        help="Read a piped STREAM up to SIZE bytes ahead in memory (as mbuffer -m SIZE), so that a bursty "
        "producer such as btrfs send runs on while the network is slower; memory grows by SIZE.",
    ),
)
output_options = options(
    click.option(
        "--listen", "address", required=True, metavar="HOST:PORT", help="Address to listen on ('*:PORT': all)."
    ),
    click.option("-o", "--output", default=None, metavar="FILE", help="Write the stream to FILE (- for stdout)."),
    click.option(
        "--exec",
        "command",
        default=None,
        metavar="CMD",
        help="Write the stream to the stdin of CMD, run by sh -c as ssh runs it (pipes work).",
    ),
)
resume_option = click.option(
    "--resume", is_flag=True, help="Continue the unfinished transfer to FILE (-o) where its last durable command ended."
)
relay_listen_option = click.option(
    "--listen", "address", required=True, metavar="HOST:PORT", help="Where the sender connects ('*:PORT': all)."
)
max_size_option = click.option(
    "--max-command-size",
    type=click.IntRange(min=1, max=MAX_COMMAND_SIZE),
    metavar="BYTES",
    help="Largest command payload accepted (default: the kernel's limit for the stream's version; "
    f"at most {MAX_COMMAND_SIZE >> 20} MiB, which one command may take in memory).",
)
_max_names = "Most names followed in one subvolume; every directory above a path counts (default: 400,000)."
# for the commands that follow names to the end of a subvolume
tracker_options = options(
    click.option("--max-names", type=click.IntRange(min=1), metavar="N", help=_max_names),
    click.option(
        "--max-held",
        type=click.IntRange(min=1),
        metavar="BYTES",
        help="Most bytes of results held until a subvolume ends: records, changes, their paths (default: 64 MiB).",
    ),
)
convert_options = options(
    click.option(
        "--to-version",
        type=click.IntRange(1, 1),
        metavar="1",
        help="Write a v1 stream for an older btrfs receive: ENCODED_WRITE decompressed into WRITEs, "
        "FALLOCATE as WRITEs of zeros, FILEATTR and ENABLE_VERITY dropped with a warning.",
    ),
    click.option(
        "--max-zero-fill",
        type=click.IntRange(min=0),
        metavar="BYTES",
        help="With --to-version 1: most bytes of zeros written for holes in all (default: 1 GiB).",
    ),
    click.option(
        "--max-names",
        type=click.IntRange(min=1),
        metavar="N",
        help="With --to-version 1: most names followed in one subvolume to know file sizes (default: 400,000).",
    ),
    click.option(
        "--parent",
        multiple=True,
        metavar="PATH",
        type=click.Path(exists=True),
        help="With --to-version 1, for an incremental: its parent, as a directory (the parent's extraction or "
        "received subvolume) or as its stream files (repeat: the full stream, then each incremental on top). "
        "A hole punched in a file of the parent becomes zeros up to that file's size, which the stream does "
        "not show: kernel v2 incrementals that punch holes in existing files need it.",
    ),
)
extract_options = options(
    click.option(
        "--clone-from",
        "clone_from",
        multiple=True,
        metavar="[UUID=]DIR",
        help="A clone source: UUID=DIR is the extraction of subvolume UUID; a plain DIR holds such "
        "extractions in subdirectories named by UUID. Repeatable.",
    ),
    click.option(
        "--per-subvolume",
        is_flag=True,
        help="Put each subvolume in DIR/NAME, as btrfs receive does (for an input of several subvolumes); "
        "an incremental becomes DIR/NAME made from a copy of its parent, extracted before it or given "
        "with --clone-from.",
    ),
    click.option(
        "--max-clone-copy",
        type=click.IntRange(min=0),
        metavar="BYTES",
        help="Most bytes of data that clones (and copies of parents, with --per-subvolume) may copy in all "
        "where DIR's file system cannot reflink (default: 64 GiB).",
    ),
    click.option("-q", "--quiet", is_flag=True, help="No warnings about skipped commands and no summary."),
)


@dataclasses.dataclass(frozen=True)
class TlsOptions:
    """--tls, --key and --identity of one end (of a relay's ``leg``)."""

    mode: str
    key_file: str | None
    identity: str
    leg: str = ""

    def key(self) -> bytes | None:
        """The pre-shared key: from --key, else a password asked on the terminal (None for --tls none)."""
        return psk(self.mode, self.key_file, self.identity, self.leg)

    def settings(self, key: bytes | None) -> TlsSettings:
        from ..transport.address import TlsSettings

        return TlsSettings(self.mode, key, self.identity)


def tls_options(leg: str = "", of: str = "") -> Decorator:
    """--tls, --key and --identity as one :class:`TlsOptions` named ``tls`` (for a leg of a relay
    --LEG-tls, --LEG-key and --LEG-identity as ``LEG_tls``), whose help ends with ``of``."""
    flag, name = (f"--{leg}-", f"{leg}_") if leg else ("--", "")
    return grouped(
        f"{name}tls",
        lambda mode, key_file, identity: TlsOptions(mode, key_file, identity, leg),
        (f"{name}mode", f"{name}key_file", f"{name}identity"),
        click.option(
            f"{flag}tls",
            f"{name}mode",
            type=click.Choice(tls.MODES),
            default=tls.DEFAULT_MODE,
            show_default=True,
            help=f"TLS version and cipher{of}; 'none' is raw TCP (only when asked).",
        ),
        click.option(
            f"{flag}key",
            f"{name}key_file",
            type=click.Path(dir_okay=False),
            help=f"Pre-shared key file{of} (PEM, else raw bytes); without it, a password is asked on the terminal.",
        ),
        click.option(
            f"{flag}identity",
            f"{name}identity",
            default="sendstream",
            show_default=True,
            help=f"Name of the pre-shared key{of}.",
        ),
    )


@dataclasses.dataclass(frozen=True)
class SenderOptions:
    """How a sending end connects and retries."""

    retries: int
    retry_delay: float
    timeout: float
    resumable: bool
    rate_limit: int | None
    compress: Tally | None

    def noted(self, summary: Summary) -> Summary:
        """``summary`` with what compression did, when it was asked for."""
        return dataclasses.replace(summary, compression=self.compress.note()) if self.compress else summary

    def retrying(self) -> dict[str, Any]:
        """The library's arguments for how a sending end retries."""
        return {"resumable": self.resumable, "retries": self.retries, "retry_delay": self.retry_delay}

    def connector(
        self, target: str, tls: TlsOptions, key: bytes | None, log: Callable[[str], object]
    ) -> Callable[[], Channel]:
        """A new channel to ``target`` on every call; the first is described to ``log``."""
        from ..endpoints.sending import connector
        from ..transport.address import Address, Dialing

        dialing = Dialing(Address.parse(target), tls.settings(key), self.timeout, self.rate_limit, self.compress)
        return connector(dialing, log)


sender_options = grouped(
    "sending",
    SenderOptions,
    ("retries", "retry_delay", "timeout", "resumable", "rate_limit", "compress"),
    click.option(
        "--retries",
        type=click.IntRange(min=0),
        default=5,
        show_default=True,
        help="Connection attempts after a drop (or before the first connection), per outage.",
    ),
    click.option(
        "--retry-delay",
        type=click.FloatRange(min=0),
        default=1.0,
        show_default=True,
        metavar="SECONDS",
        help="Wait before the second attempt; doubles with each further one (at most 30 s).",
    ),
    click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=60.0,
        show_default=True,
        metavar="SECONDS",
        help="A connection that makes no progress this long counts as dropped.",
    ),
    click.option(
        "--resumable",
        is_flag=True,
        help="Run a session that survives dropped connections (needs a sendstream receiver; ~30% slower).",
    ),
    click.option(
        "--rate-limit",
        type=ByteSize(minimum=1),
        metavar="RATE",
        help="Send at most RATE bytes a second, evenly, as pv -L does (30M: 30 MiB/s; K, M, G: powers of 1024).",
    ),
    click.option(
        "--compress",
        type=Compression(),
        metavar="zstd[:LEVEL]",
        help="Compress what goes on the wire with zstd (LEVEL 1-19, default 3), before encryption; "
        "the receiver must be sendstream.",
    ),
)

IDLE_TIMEOUT = 600.0
idle_timeout_option = click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0),
    default=IDLE_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="Once a sender said hello, the longest wait for its next byte (0: for ever); "
    "it covers `btrfs send -p` computing before it writes (see the docs: Move streams).",
)
reconnect_timeout_option = click.option(
    "--reconnect-timeout",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="After a drop, how long to wait for the sender to come back.",
)


@dataclasses.dataclass(frozen=True)
class ListenOptions:
    """How a listening end waits: for a new connection, for a quiet sender, for a dropped one."""

    timeout: float
    idle_timeout: float
    reconnect_timeout: float | None = None

    def listening(self, address: str, tls: TlsOptions, key: bytes | None) -> Listening:
        """How --listen takes its sender (an --idle-timeout of 0 waits for ever)."""
        from ..transport.address import Address, Listening

        return Listening(
            Address.parse(address, listen=True, any_port=True),  # accepted() announces the port it got
            tls.settings(key),
            self.timeout,
            self.idle_timeout or None,
            self.reconnect_timeout,
        )


def listen_options(*, reconnect: bool = False) -> Decorator:
    """--timeout (a new connection's handshake and hello), --idle-timeout and, with
    ``reconnect``, --reconnect-timeout, as one :class:`ListenOptions` named ``listen``."""
    timeout = click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=30.0,
        show_default=True,
        metavar="SECONDS",
        help="Longest a new connection may take for its TLS handshake and hello, all of it together; "
        "a connection that does not make it is refused and the wait goes on.",
    )
    if reconnect:
        names = ("timeout", "idle_timeout", "reconnect_timeout")
        return grouped("listen", ListenOptions, names, reconnect_timeout_option, timeout, idle_timeout_option)
    return grouped("listen", ListenOptions, ("timeout", "idle_timeout"), timeout, idle_timeout_option)
