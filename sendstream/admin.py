"""The commands around the streams: pre-shared keys and the manual."""

from __future__ import annotations

import click

from .terminal import Group, warn


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
    from .net.tls.keys import fingerprint, new_key_file

    click.echo(f"{fingerprint(new_key_file(file))} {file}")


@key.command("fingerprint")
@click.argument("file", type=click.Path(dir_okay=False))
def key_fingerprint(file: str) -> None:
    """Print the fingerprint of the key in FILE, as the other end would use it.

    Two ends with the same fingerprint have the same key. For a raw key file
    it is the start of `sha256sum FILE`.
    """
    from .net.tls.keys import fingerprint, load_key

    click.echo(f"{fingerprint(load_key(file, warn=warn))} {file}")


@click.command(cls=Group.command_class)
@click.pass_context
def man(ctx: click.Context) -> None:
    """Print the manual page (roff), made from these commands' own help."""
    from .manual import manpage

    root = ctx.find_root().command
    assert isinstance(root, click.Group)
    click.echo(manpage(root), nl=False)
