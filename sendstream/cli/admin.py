"""The commands around the streams: pre-shared keys, the manual, and the service (``serve``, ``send --list``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .terminal import Group, interrupted, read_key, warn

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..service.config import Config
    from ..transport.tls import Channel


@click.group(cls=Group)
def key() -> None:
    """Make and compare pre-shared keys (--key FILE)."""


@key.command("new")
@click.argument("file", type=click.Path(dir_okay=False))
def key_new(file: str) -> None:
    """Write a new random 32-byte key to FILE (mode 0600, never over an existing file).

    The key is a PEM block, so no editor or newline can change it. Copy FILE
    to the other end and compare the fingerprints on both.
    """
    from ..transport.tls.keys import fingerprint, new_key_file

    click.echo(f"{fingerprint(new_key_file(file))} {file}")


@key.command("fingerprint")
@click.argument("file", type=click.Path(dir_okay=False))
def key_fingerprint(file: str) -> None:
    """Print the fingerprint of the key in FILE, as the other end would use it.

    Two ends with the same fingerprint have the same key. For a raw key file
    it is the start of `sha256sum FILE`.
    """
    from ..transport.tls.keys import fingerprint

    click.echo(f"{fingerprint(read_key(file))} {file}")


@click.command(cls=Group.command_class)
@click.argument(
    "page",
    required=False,
    default="sendstream",
    type=click.Choice(["sendstream", "sendstream-serve.toml", "sendstream-backup.toml"]),
)
@click.pass_context
def man(ctx: click.Context, page: str) -> None:
    """Print a manual page (roff): sendstream(1), made from these commands' own help,
    sendstream-serve.toml(5), the service's configuration file, or sendstream-backup.toml(5), a host's."""
    from .manual import backup_toml_page, manpage, serve_toml_page

    root = ctx.find_root().command
    assert isinstance(root, click.Group)
    pages = {"sendstream-serve.toml": serve_toml_page, "sendstream-backup.toml": backup_toml_page}
    click.echo(manpage(root) if page == "sendstream" else pages[page](), nl=False)


@click.command(cls=Group.command_class)
@click.option(
    "--config",
    "config_path",
    required=True,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="The service's TOML file: where to listen, and each client's identity, key and place "
    "(see sendstream-serve.toml(5)).",
)
@click.option("--check-config", is_flag=True, help="Check FILE (keys, places, names) and say what is wrong, then exit.")
@click.option(
    "--journals",
    "list_journals",
    is_flag=True,
    help="List the journals of unfinished transfers in every client's place (client, stream, bytes, last write), "
    "then exit.",
)
@click.option(
    "--remove-journal",
    "remove_journals",
    multiple=True,
    metavar="CLIENT/STREAM",
    help="Remove the journal of STREAM (as --journals names it) in CLIENT's place, then exit; of a transfer "
    "that is not running. Repeatable.",
)
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
def serve(
    config_path: str,
    check_config: bool,
    list_journals: bool,
    remove_journals: tuple[str, ...],
    log_format: str,
    metrics: str | None,
) -> None:
    """Receive streams from many clients at once, each authenticated by its key
    and stored in its own place, until SIGTERM or Ctrl-C.

    A client with a wrong key, one that sends garbage or nothing, a damaged
    stream: each ends its own connection, with a logged reason and a status
    to the sender, and the service goes on. A stream is stored whole and
    checked, named by its subvolume UUID and ctransid (and its parent's),
    with a JSON manifest beside it. SIGHUP reads FILE again: running
    transfers go on, but those of a client removed or whose key changed are
    cut; a wrong FILE is logged and the running configuration kept.
    """
    from ..service import config as configuration
    from ..service.daemon import serve_until_stopped
    from ..service.log import EventLog

    config = configuration.load(config_path, warn=warn)
    if check_config:
        click.echo(
            f"{config_path}: ok: {len(config.clients)} client{'s' * (len(config.clients) != 1)} "
            f"({', '.join(sorted(config.clients))}), {config.tls} on {config.listen.host}:{config.listen.port}"
        )
    if remove_journals or list_journals:
        journals(config, remove_journals, list_journals)
    if check_config or remove_journals or list_journals:
        return
    serve_until_stopped(config, EventLog(sys.stderr, log_format), metrics, again=interrupted)


def journals(config: Config, removed: tuple[str, ...], listed: bool) -> None:
    """``serve --remove-journal CLIENT/STREAM`` and ``--journals``: remove, then list, what unfinished
    transfers left in the clients' places."""
    import datetime

    from ..errors import UsageError
    from ..service import journals as found

    for text in removed:
        identity, _, name = text.partition("/")
        client = config.clients.get(identity)
        if client is None or not name:
            raise UsageError(f"--remove-journal {text!r}: expected CLIENT/STREAM, CLIENT one of the configuration's")
        journal = found.named(client, name)
        found.remove(journal.path)
        click.echo(f"removed {identity}/{name} ({journal.size} bytes)")
    for client in config.clients.values() if listed else ():
        for journal in found.unfinished(client):
            when = datetime.datetime.fromtimestamp(journal.written, datetime.UTC).isoformat(timespec="seconds")
            click.echo(f"{client.identity} {journal.name} {journal.size} bytes, last written {when}")


def list_held(connect: Callable[[], Channel], as_json: bool) -> None:
    """``send --list``: print what a ``sendstream serve`` holds for us, one snapshot a line (what the service
    says escaped: a name may hold anything)."""
    import json

    from ..endpoints.sending import list_held as listed
    from ..transfer.identity import printable

    for s in listed(connect):
        if as_json:
            click.echo(json.dumps(s, sort_keys=True))
            continue
        parent = f"from {s.get('parent_uuid')}.{s.get('parent_ctransid')}" if s.get("parent_uuid") else "full"
        line = f"{s.get('uuid')}.{s.get('ctransid')} {parent} {s.get('name')}"
        if s.get("snapshot") not in (None, s.get("name")):  # a stored stream's file is named by what it is
            line += f" snapshot {s.get('snapshot')}"
        click.echo(printable(line + (f" arrived {s.get('arrived')}" if s.get("arrived") else "")))
