"""The command line's examples and its manual page, made from its own declarations (so it never
disagrees with ``-h``)."""

from __future__ import annotations

import click

from . import __version__

# Shown at the end of each command's -h, and in the manual.
EXAMPLES: dict[str, tuple[str, ...]] = {
    "dump": ("btrfs send /mnt/snap | sendstream dump", "sendstream dump --json snap.stream | jq .name"),
    "verify": (
        "sendstream verify snap.stream",
        "btrfs send /mnt/snap | sendstream verify",
        "sendstream verify --from-socket '*:7000' --key psk.key",
        "sendstream verify s3://backups/host1",
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
    "archive prune": ("sendstream archive prune s3://backups/host1 --keep-last 14 --dry-run",),
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
    "man": ("sendstream man | man -l -", "sendstream man > /usr/local/share/man/man1/sendstream.1"),
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
    (130, "interrupted (Ctrl-C)"),
)


def _roff(text: str) -> str:
    lines = []
    for line in text.replace("\\", "\\e").splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines).replace("-", "\\-")


def _leaves(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found: list[tuple[tuple[str, ...], click.Command]] = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += _leaves(command, (*prefix, name))
        else:
            found.append(((*prefix, name), command))
    return found


def manpage(group: click.Group) -> str:
    """``sendstream(1)`` in roff, from ``group``'s commands, arguments and options."""
    import datetime  # here: every command's start-up imports this module for its examples

    today = datetime.date.today().isoformat()
    out = [
        f'.TH SENDSTREAM 1 "{today}" "sendstream {__version__}" "User Commands"',
        ".SH NAME",
        "sendstream \\- " + _roff(group.help or "").splitlines()[0],
        ".SH SYNOPSIS",
        ".B sendstream",
        "[\\fB\\-V\\fR] [\\fB\\-\\-traceback\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGUMENTS\\fR]",
        ".SH COMMANDS",
    ]
    for path, command in _leaves(group):
        ctx = click.Context(command, info_name=" ".join(("sendstream", *path)))
        out += [
            ".SS " + _roff(" ".join(path)),
            ".nf",
            _roff(" ".join(("sendstream", *path, *command.collect_usage_pieces(ctx)))),
            ".fi",
        ]
        for paragraph in [*(command.help or "").split("\n\n"), command.epilog or ""]:
            lines = [line.strip() for line in paragraph.strip().splitlines()]
            if lines and lines[0] == "\b":
                out += [".PP", ".nf", _roff("\n".join(lines[1:])), ".fi"]
            elif lines:
                out += [".PP", _roff(" ".join(lines))]
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            if record:
                out += [".TP", "\\fB" + _roff(record[0]) + "\\fR", _roff(record[1])]
    out += [".SH EXIT STATUS"]
    for code, meaning in EXIT_STATUS:
        out += [".TP", f"\\fB{code}\\fR", _roff(meaning)]
    out += [
        ".SH SHELL COMPLETION",
        'bash: \\fBeval "$(_SENDSTREAM_COMPLETE=bash_source sendstream)"\\fR in ~/.bashrc;'
        " zsh: zsh_source; fish: fish_source.",
        ".SH SEE ALSO",
        "\\fBbtrfs-send\\fR(8), \\fBbtrfs-receive\\fR(8)",
    ]
    return "\n".join(out) + "\n"
