"""The command line's examples and its manual page, made from its own declarations (so it never
disagrees with ``-h``)."""

from __future__ import annotations

import click

from .. import __version__

# Shown at the end of each command's -h, and in the manual.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "dump": ("btrfs send /mnt/snap | sendstream dump", "sendstream dump --json snap.stream | jq .name"),
    "verify": (
        "sendstream verify snap.stream",
        "btrfs send /mnt/snap | sendstream verify",
        "sendstream verify --from-socket '*:7000' --key psk.key",
        "sendstream verify s3://backups/host1",
        "sendstream verify s3://backups/host1 --scheduler tcp://10.0.0.10:8786",
    ),
    "convert": ("sendstream convert --to-version 1 new.stream old.stream",),
    "ls": ("sendstream ls incr.stream",),
    "diff": ("btrfs send -p /mnt/snap1 /mnt/snap2 | sendstream diff",),
    "repair": ("btrfs send /mnt/snap | sendstream repair - - | btrfs receive /mnt/backup",),
    "send": (
        "btrfs send /mnt/snap | sendstream send --to backup:7000 --key psk.key",
        "sendstream send --to backup:7000 --key psk.key --resumable --progress plain snap.stream",
        "btrfs send /mnt/snap | sendstream send --to s3://backups/host1 --resumable --key psk.key -",
    ),
    "restore": (
        "sendstream restore s3://backups/host1/home.20261201 --exec 'btrfs receive /mnt/restore'",
        "sendstream restore s3://backups/host1/UUID -o chain.stream",
    ),
    "archive ls": ("sendstream archive ls s3://backups/host1", "sendstream archive ls --json s3://backups/host1"),
    "archive prune": (
        "sendstream archive prune s3://backups/host1 --keep-last 14 --dry-run",
        'sendstream archive prune s3://backups/host1 --preserve "14d 10w *m" --dry-run',
    ),
    "receive": (
        "sendstream receive --listen '*:7000' --key psk.key --exec 'btrfs receive /mnt/backup'",
        "sendstream receive --listen '*:7000' --key psk.key --exec 'zstd -d | btrfs receive /mnt/backup'",
        "sendstream receive --listen '*:7000' --key psk.key -o snap.stream",
    ),
    "relay": ("sendstream relay --listen '*:7000' --listen-key in.key --to backup:7000 --to-key out.key",),
    "extract": ("sendstream extract snap.stream /srv/restore",),
    "paths": ("sendstream paths --json incr.stream",),
    "stats": ("btrfs send /mnt/snap | sendstream stats",),
    "new": ("sendstream key new /etc/sendstream/backup.key",),
    "fingerprint": ("sendstream key fingerprint /etc/sendstream/backup.key",),
    "serve": (
        "sendstream serve --config /etc/sendstream/serve.toml --check-config",
        "sendstream serve --config /etc/sendstream/serve.toml --log-format json",
    ),
    "backup run": (
        "sendstream backup run --dry-run",
        "sendstream backup run --config /etc/sendstream/backup.toml",
    ),
    "backup status": ("sendstream backup status", "sendstream backup status --json | jq 'select(.stale)'"),
    "man": (
        "sendstream man | man -l -",
        "sendstream man sendstream-serve.toml | man -l -",
        "sendstream man > /usr/local/share/man/man1/sendstream.1",
        "sendstream man sendstream-serve.toml > /usr/local/share/man/man5/sendstream-serve.toml.5",
        "sendstream man sendstream-backup.toml | man -l -",
    ),
}


def epilog(name: str) -> str | None:
    """The examples of command ``name`` as click shows them (``\\b``: not rewrapped)."""
    lines = EXAMPLES.get(name)
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines) if lines else None


EXIT_STATUS = (
    (0, "success: the stream is good"),
    (1, "the stream is corrupt (bad header, CRC, attribute, unknown command, trailing bytes)"),
    (2, "usage error, or a stream from or to a terminal"),
    (3, "the input ended early"),
    (4, "I/O or network error (a missing file or key file, a refused connection, a full disk)"),
    (5, "the send restarted (repair fixes it), or a replay that differs"),
    (6, "TLS: wrong key or identity, another mode, no TLS, a cut connection, a key file others can read"),
    (7, "the command of receive --exec failed"),
    (8, "a limit was reached (the message names the option)"),
    (9, "nothing found: no archived stream where told to look (a prefix, a snapshot)"),
    (10, "backup run: a target failed (the others were backed up)"),
    (11, "backup status: a target is behind its warn_after, holds nothing, or cannot be reached"),
    (130, "interrupted (Ctrl-C)"),
)


ENVIRONMENT = (
    ("TZ", "the time zone of the times dump prints (as btrfs receive --dump does)"),
    ("SENDSTREAM_PURE", "1: the pure-Python path instead of the native module (verify -v says which ran)"),
    ("SENDSTREAM_NO_KTLS", "1: keep TLS records in user space, never hand them to the kernel (kTLS)"),
    (
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE",
        "the object store's credentials, found as boto3 finds them (also in ~/.aws/credentials and ~/.aws/config)",
    ),
    ("AWS_ENDPOINT_URL", "the object store's endpoint, http:// or https:// with a host (--endpoint-url overrides it)"),
    (
        "SENDSTREAM_ENCRYPT_KEY",
        "on a Dask worker (verify --scheduler): the file of the key a sealed archive is opened with",
    ),
    (
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE, DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT, "
        "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY",
        "the CA and this client's certificate and key for a tls:// --scheduler (Dask's own settings)",
    ),
    (
        "MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_",
        "serve sets glibc's to 2 and 128 KiB unless the environment sets them, so that memory goes back to the system",
    ),
    ("_SENDSTREAM_COMPLETE", "bash_source, zsh_source or fish_source: print the shell's completion script"),
)

FILES = (
    ("FILE.part, FILE.part.resume", "receive --resume -o FILE: the part written so far and its resume token"),
    ("NAME.stream, NAME.stream.json", "serve, a client's store place: a stored stream and its manifest"),
    (".NAME.incoming.part", "serve: the journal of a transfer not yet whole, resumed when its sender comes back"),
    ("/etc/sendstream/serve.toml", "serve --config: the service's configuration, see sendstream-serve.toml(5)"),
    (
        "/etc/sendstream/backup.toml",
        "backup --config: the host's subvolumes, targets and policies, see sendstream-backup.toml(5)",
    ),
    ("/run/sendstream-backup.lock", "backup run: held while a run runs (its process ID in it)"),
    ("contrib/sendstream-backup.service, .timer", "in the source: backup run every night under systemd"),
    ("contrib/sendstream-serve.service", "in the source: the service under systemd, sandboxed"),
    ("~/.aws/credentials, ~/.aws/config", "the object store's credentials and settings (boto3's)"),
)


def _roff(text: str) -> str:
    lines = []
    for line in text.replace("\\", "\\e").splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines).replace("-", "\\-")


def _leaves(
    group: click.Group, prefix: tuple[str, ...] = (), parent: click.Context | None = None
) -> list[tuple[tuple[str, ...], click.Command, click.Context]]:
    """Every command under ``group`` with its context, made under the group's (``-h`` as well as ``--help``)."""
    found: list[tuple[tuple[str, ...], click.Command, click.Context]] = []
    ctx = click.Context(group, parent=parent, **group.context_settings)
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)  # the lazy ones load
        assert command is not None  # a name the group lists
        path = (*prefix, name)
        if isinstance(command, click.Group):
            found += _leaves(command, path, ctx)
        else:
            found.append((path, command, click.Context(command, info_name=" ".join(("sendstream", *path)), parent=ctx)))
    return found


def _paragraphs(command: click.Command) -> list[tuple[bool, str]]:
    """The help and examples of ``command``, each paragraph (preformatted?, its text)."""
    found = []
    for paragraph in [*(command.help or "").split("\n\n"), command.epilog or ""]:
        lines = [line.strip() for line in paragraph.strip().splitlines()]
        if lines and lines[0] == "\b":
            found.append((True, "\n".join(lines[1:])))
        elif lines:
            found.append((False, " ".join(lines)))
    return found


def _header(name: str, section: int) -> str:
    import datetime  # here: every command's start-up imports this module for its examples

    title = "File Formats" if section == 5 else "User Commands"
    return f'.TH {name.upper()} {section} "{datetime.date.today().isoformat()}" "sendstream {__version__}" "{title}"'


def _entries(pairs: tuple[tuple[str, str], ...]) -> list[str]:
    out = []
    for term, meaning in pairs:
        out += [".TP", "\\fB" + _roff(term) + "\\fR", _roff(meaning)]
    return out


def manpage(group: click.Group) -> str:
    """``sendstream(1)`` in roff, from ``group``'s commands, arguments and options."""
    out = [
        _header("sendstream", 1),
        ".SH NAME",
        "sendstream \\- " + _roff(group.help or "").splitlines()[0],
        ".SH SYNOPSIS",
        ".B sendstream",
        "[\\fB\\-V\\fR] [\\fB\\-\\-traceback\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGUMENTS\\fR]",
        ".SH DESCRIPTION",
        _roff(
            "sendstream reads, checks, heals and writes the streams of btrfs send, moves them over TLS with a "
            "pre-shared key (one receiver, a relay, or a service for many hosts), archives them in object storage "
            "and extracts them without btrfs. Every command checks every command of a stream (framing, CRC-32C, "
            "attributes) before it hands a byte on."
        ),
        ".SH COMMANDS",
    ]
    for path, command, ctx in _leaves(group):
        out += [".SS " + _roff(" ".join(path)), ".nf", _roff(_usage(path, command, ctx)), ".fi"]
        for pre, text in _paragraphs(command):
            out += [".PP", ".nf", _roff(text), ".fi"] if pre else [".PP", _roff(text)]
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            if record:
                # a choice may break after each | (\\: is a break point that prints nothing)
                out += [".TP", "\\fB" + _roff(record[0]).replace("|", "|\\:") + "\\fR", _roff(record[1])]
    out += [".SH EXIT STATUS", *_entries(tuple((str(code), meaning) for code, meaning in EXIT_STATUS))]
    out += [".SH ENVIRONMENT", *_entries(ENVIRONMENT), ".SH FILES", *_entries(FILES)]
    out += [
        ".SH SHELL COMPLETION",
        'bash: \\fBeval "$(_SENDSTREAM_COMPLETE=bash_source sendstream)"\\fR in ~/.bashrc;'
        " zsh: zsh_source; fish: fish_source.",
        ".SH SEE ALSO",
        "\\fBsendstream\\-serve.toml\\fR(5), \\fBbtrfs\\-send\\fR(8), \\fBbtrfs\\-receive\\fR(8)",
    ]
    return "\n".join(out) + "\n"


def _usage(path: tuple[str, ...], command: click.Command, ctx: click.Context) -> str:
    return " ".join(("sendstream", *path, *command.collect_usage_pieces(ctx)))


def markdown(group: click.Group) -> str:
    """The command-line reference of the docs site, in Markdown, from the same declarations as the manual."""
    out = []
    for path, command, ctx in _leaves(group):
        out += [f"## {' '.join(path)}", "", "```text", _usage(path, command, ctx), "```", ""]
        for pre, text in _paragraphs(command):
            out += ["```text", text, "```", ""] if pre else [text, ""]
        records = [record for param in command.get_params(ctx) if (record := param.get_help_record(ctx))]
        if records:
            out += ["| option | meaning |", "| --- | --- |"]
            # a | inside backticks does not end a cell (Python-Markdown's tables); elsewhere it is escaped
            out += [f"| `{name}` | {_cell(meaning)} |" for name, meaning in records]
            out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# sendstream-serve.toml(5): every setting of the service's file; ranges and defaults come from its loader.
SERVE_SETTINGS = (
    ("listen", "HOST:PORT, [IPv6]:PORT, or *:PORT for every address; required. A reload (SIGHUP) cannot move it"),
    (
        "tls",
        "every client's TLS mode: tls13-aes128-gcm (default), tls13-aes256-gcm, tls12-aes128-gcm or "
        "tls12-aes256-gcm; never none (see trusted)",
    ),
    ("max_transfers", "transfers and --list requests at once, all clients together"),
    ("max_per_client", "transfers and --list requests at once of one client"),
    ("handshake_timeout", "seconds for a connection's handshake and first words"),
    ("idle_timeout", "seconds without a byte from a sender before its transfer is cut (0: for ever)"),
    ("journal_days", "days an abandoned transfer's journal is kept unwritten (0: for ever)"),
    (
        "proxy_from",
        "addresses or networks (a list) of TCP balancers in front of the service (HAProxy's send-proxy-v2): a "
        "connection from one must begin with a PROXY protocol v2 header, and the client's address it names is "
        "the one trusted checks and the log shows; from any other address no header is read; default: none",
    ),
)
CLIENT_SETTINGS = (
    (
        "key",
        "the client's pre-shared key file (sendstream key new), relative to this file's directory; required, "
        "and no two clients may share a key",
    ),
    (
        "store",
        "a directory where its streams are stored, each with a JSON manifest, or s3://BUCKET/PREFIX; "
        "one of store and receive",
    ),
    ("receive", "a directory on btrfs where its streams go into btrfs receive, confined to it"),
    (
        "trusted",
        "addresses or networks (a list) from which it may also send unencrypted (--tls none); "
        "no two clients' lists may overlap",
    ),
    ("quota", "the most its store place may hold, in bytes or with K, M, G, T (powers of 1024); default: no bound"),
    (
        "preserve",
        'after each of its transfers, keep only what this btrbk preserve policy keeps of its place ("14d 10w *m"), '
        "by the time in each snapshot's name, and what kept streams build on; default: keep everything",
    ),
    ("preserve_min", "with preserve: keep everything younger than this age (2d), or all, latest (the default), no"),
    ("preserve_day_of_week", "with preserve: the day weeks start on; default: sunday"),
    ("preserve_hour_of_day", "with preserve: the hour days start at, 0 to 23; default: 0"),
)


def serve_toml_page() -> str:
    """``sendstream-serve.toml(5)`` in roff: the service's configuration file, setting by setting."""
    from ..service.config import BOUNDS

    def settings(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        shown = []
        for name, meaning in pairs:
            if name in BOUNDS:
                low, high, default = BOUNDS[name]
                meaning += f"; {_number(low)} to {_number(high)}, default {_number(default)}"
            shown.append((name, meaning + "."))
        return tuple(shown)

    out = [
        _header("sendstream-serve.toml", 5),
        ".SH NAME",
        "sendstream\\-serve.toml \\- the configuration of sendstream serve",
        ".SH SYNOPSIS",
        "\\fBsendstream serve \\-\\-config\\fR \\fIFILE\\fR [\\fB\\-\\-check\\-config\\fR]",
        ".SH DESCRIPTION",
        _roff(
            "A TOML file (at most 1 MiB) that names where the service listens and every client: its identity "
            "(the table's name, which the client gives as --identity), its key and its place. Where a client's "
            "streams land is decided from the identity its key proved, never from anything it sends. "
            "serve --check-config reads every key file and place and names the file, the line and what was "
            "expected; kill -HUP reloads the file."
        ),
        ".SH SETTINGS",
        *_entries(settings(SERVE_SETTINGS)),
        ".SH CLIENTS",
        _roff(
            "Each client is a table [clients.NAME]; NAME is 1-64 letters, digits, '.', '_', '-', not starting "
            "with '.' or '-'. No client's place may be, or be inside, another's."
        ),
        *_entries(settings(CLIENT_SETTINGS)),
        ".SH EXAMPLE",
        ".nf",
        _roff(SERVE_EXAMPLE),
        ".fi",
        ".SH SEE ALSO",
        "\\fBsendstream\\fR(1)",
    ]
    return "\n".join(out) + "\n"


# sendstream-backup.toml(5): every setting of a host's backup file, by table.
BACKUP_SETTINGS = (
    ("lock", "the file a run holds locked, so that two runs never overlap; default /run/sendstream-backup.lock"),
    ("preserve", 'what of the host\'s snapshots is kept, a btrbk preserve policy ("7d 4w"); default: all'),
    ("preserve_min", "with preserve: keep everything younger than this age (2d), or all, latest (the default), no"),
    ("preserve_day_of_week", "with preserve: the day weeks start on; default: sunday"),
    ("preserve_hour_of_day", "with preserve: the hour days start at, 0 to 23; default: 0"),
)
SUBVOLUME_SETTINGS = (
    ("path", "the subvolume; required. Its snapshots are NAME.YYYYMMDDTHHMM, NAME the table's"),
    ("snapshots", "the directory its read-only snapshots go into; default: the one the subvolume is in"),
    ("targets", "the names of the targets it goes to (a list); default: every target"),
    ("preserve, preserve_min, preserve_day_of_week, preserve_hour_of_day", "its own policy, instead of the file's"),
)
TARGET_SETTINGS = (
    ("service", "HOST:PORT of a sendstream serve; with key and identity. It keeps by its own serve.toml"),
    ("bucket", "s3://BUCKET/PREFIX: an archive in object storage (the AWS_* credentials, as boto3 finds them)"),
    ("receive", "a directory on btrfs that btrfs receive writes into (an external disk)"),
    (
        "key",
        "a service's: the pre-shared key file; a bucket's: signs its resumable upload state (without: not resumable)",
    ),
    ("identity", "a service's: the client name the key goes by"),
    ("tls", "a service's TLS mode; default tls13-aes128-gcm"),
    ("timeout", "a service's: seconds for a connection and its handshake; 0.1 to 3600, default 30"),
    ("rate_limit", "a service's: bytes a second at most (30M); default: no bound"),
    ("retries", "a service's or a bucket's: attempts again after a failure, per outage; 0 to 1000, default 5"),
    ("encrypt_key", "a bucket's: the key its parts are sealed with"),
    ("endpoint_url", "a bucket's: the object store's endpoint (or AWS_ENDPOINT_URL)"),
    (
        "full_every",
        "a bucket's or a receive directory's: a full stream again after this many incrementals (10) "
        '(or this age, "30d")',
    ),
    ("warn_after", 'backup status exits 11 when the newest snapshot there is older ("2d")'),
    (
        "preserve, preserve_min, preserve_day_of_week, preserve_hour_of_day",
        "a bucket's (not with encrypt_key) or a receive directory's policy: what a run keeps there; default: all",
    ),
)
BACKUP_EXAMPLE = """preserve = "7d 4w"

[subvolumes.home]
path = "/home"
snapshots = "/snapshots"

[targets.nas]
service = "backup.example:7000"
key = "/etc/sendstream/web1.key"
identity = "web1"
warn_after = "2d"

[targets.offsite]
bucket = "s3://backups/web1"
key = "/etc/sendstream/web1.key"
full_every = "30d"
preserve = "30d 12m"
"""


def backup_toml_page() -> str:
    """``sendstream-backup.toml(5)`` in roff: a host's backup configuration, table by table."""
    out = [
        _header("sendstream-backup.toml", 5),
        ".SH NAME",
        "sendstream\\-backup.toml \\- the configuration of sendstream backup",
        ".SH SYNOPSIS",
        "\\fBsendstream backup run\\fR|\\fBstatus\\fR [\\fB\\-\\-config\\fR \\fIFILE\\fR]",
        ".SH DESCRIPTION",
        _roff(
            "A TOML file (at most 1 MiB; /etc/sendstream/backup.toml by default) that names the subvolumes a host "
            "backs up and the targets they go to. Paths are relative to its directory; every key file is read "
            "when it is; a mistake is named with the file, the line and what was expected. Policies are btrbk's "
            "preserve syntax, by the time in each snapshot's name."
        ),
        ".SH SETTINGS",
        *_entries(tuple((n, m + ".") for n, m in BACKUP_SETTINGS)),
        ".SH SUBVOLUMES",
        _roff("Each subvolume is a table [subvolumes.NAME]; NAME is 1-64 letters, digits, '_', '-'."),
        *_entries(tuple((n, m + ".") for n, m in SUBVOLUME_SETTINGS)),
        ".SH TARGETS",
        _roff("Each target is a table [targets.NAME] with one of service, bucket or receive."),
        *_entries(tuple((n, m + ".") for n, m in TARGET_SETTINGS)),
        ".SH EXAMPLE",
        ".nf",
        _roff(BACKUP_EXAMPLE),
        ".fi",
        ".SH SEE ALSO",
        "\\fBsendstream\\fR(1), \\fBsendstream\\-serve.toml\\fR(5)",
    ]
    return "\n".join(out) + "\n"


def _number(value: float) -> str:
    return f"{value:g}"


SERVE_EXAMPLE = """listen = "*:7000"
max_transfers = 16
max_per_client = 2

[clients.web1]
key = "keys/web1.key"
store = "/srv/streams/web1"
quota = "500G"

[clients.db1]
key = "keys/db1.key"
receive = "/mnt/backup/db1"
trusted = ["10.1.2.3"]
"""
