"""What a person at a terminal sees and types: warnings, -v messages, progress, the
password, and the end of a command (its error line and exit code)."""

from __future__ import annotations

import errno
import importlib
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

import click

from .. import errors as e

CLEANUP_SECONDS = 10  # after a Ctrl-C, how long the cleanup may take before the process ends anyway


def interrupted(signum: int, frame: object) -> None:
    """The SIGINT handler: the first Ctrl-C raises KeyboardInterrupt, so outputs are closed or removed,
    within :data:`CLEANUP_SECONDS`; a second one ends the process at once."""
    signal.signal(signal.SIGINT, _interrupted_again)
    timer = threading.Timer(CLEANUP_SECONDS, _give_up)
    timer.daemon = True
    timer.start()
    raise KeyboardInterrupt


def _interrupted_again(signum: int, frame: object) -> None:
    os.write(2, b"sendstream: interrupted again: stopped before the cleanup ended\n")
    os._exit(e.EXIT_INTERRUPTED)


def _give_up() -> None:
    os.write(2, b"sendstream: interrupted: the cleanup took more than %d s; stopped\n" % CLEANUP_SECONDS)
    os._exit(e.EXIT_INTERRUPTED)


def warn(message: str) -> None:
    click.echo(f"sendstream: warning: {message}", err=True)


def error(message: str) -> None:
    click.echo(f"sendstream: error: {message}", err=True)


def logger(verbose: bool, prefix: str = "") -> Callable[[str], object]:
    """Where -v messages go: stderr, after ``prefix`` (a relay's leg); nowhere without -v."""

    def log(text: str) -> None:
        if verbose:
            click.echo(f"sendstream: {prefix}{text}", err=True)

    return log


def warner(prefix: str = "") -> Callable[[str], object]:
    """Where warnings go: stderr always (a refused connection is a security event), after ``prefix``."""
    return lambda text: warn(f"{prefix}{text}")


def read_key(key_file: str) -> bytes:
    """The key in ``key_file`` (``--key``, ``--encrypt-key``), a file that looks like text warned of: every
    command reads a key file this way."""
    from ..transport.tls import load_key

    return load_key(key_file, warn=warn)


def psk(mode: str, key_file: str | None, identity: str, leg: str = "") -> bytes | None:
    """The key of ``--tls``/``--key``/``--identity`` (of a relay's ``leg``): the file, else a password asked."""
    import getpass

    from ..transport.tls import derive_key

    flag = f"--{leg}-" if leg else "--"
    if mode == "none":
        warn(f"{flag}tls none: the stream crosses the network unencrypted")
        return None
    if key_file:
        return read_key(key_file)
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


class ReaderGone(Exception):
    """Standard output's reader went away (``| head``): not an error of ours."""


class PipeBroken(Exception):
    """A broken pipe that is not standard output's (a receiver, a child, a fifo that went away): an error."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause)
        self.cause = cause


def standard_output_gone() -> bool:
    """Whether standard output is a pipe or socket whose reader went away (poll says POLLERR or POLLHUP)."""
    poller = select.poll()
    try:
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (AttributeError, OSError, ValueError):
        return False
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


# Where each command reads and writes a stream, by parameter name: a stream
# never comes from, or goes to, a terminal (as `btrfs send` and `zfs send` refuse).
_STREAM_INPUTS = ("stream", "source")
_STREAM_OUTPUTS = {"repair": "target", "convert": "target"}


class Command(click.Command):
    """A command with its examples at the end of its help, that refuses to read a
    stream from a terminal (it would wait there) or write one to it (usage, exit 2)."""

    def __init__(self, name: str | None, **kwargs: Any) -> None:
        from .manual import epilog

        kwargs.setdefault("epilog", epilog(name or ""))
        super().__init__(name, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        params = ctx.params
        if _tty(sys.stdin) and not params.get("address") and "-" in (params.get(p) for p in _STREAM_INPUTS):
            raise click.UsageError(
                f"no stream given, and standard input is a terminal: give a file, or pipe a stream in "
                f"(btrfs send SNAPSHOT | sendstream {ctx.info_name} ...)",
                ctx,
            )
        if _tty(sys.stdout) and _writes_stream_to_stdout(ctx.info_name or "", params):
            raise click.UsageError(
                "refusing to write a stream to a terminal: redirect standard output "
                "(> FILE, | btrfs receive DIR) or name a file",
                ctx,
            )
        return super().invoke(ctx)


def _tty(stream: IO[str] | None) -> bool:
    return stream is not None and stream.isatty()  # None: the process was started with that fd closed


def _writes_stream_to_stdout(name: str, params: dict[str, Any]) -> bool:
    if name in ("receive", "restore"):
        return params.get("command") is None and params.get("output") in (None, "-")
    return name in _STREAM_OUTPUTS and params.get(_STREAM_OUTPUTS[name]) == "-"


class Group(click.Group):
    """The command group: a reader that goes away ends a command quietly. ``lazy`` names commands by where they
    live (``".remote:send"``): each loads when it is run or listed, so a command's start pays only for its own."""

    command_class = Command
    group_class = type  # subgroups (``key``) are of this class too

    def __init__(self, *args: Any, lazy: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module, name = self.lazy[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module, __package__), name), cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        # click turns EPIPE into exit 1 on its own; every command of ours ends quietly with 0 when standard
        # output's reader went away, and fails on any other broken pipe (a receiver, a child, a fifo)
        try:
            return super().invoke(ctx)
        except OSError as exc:
            if exc.errno != errno.EPIPE:  # (click ends any EPIPE with exit 1 and no word: ours too)
                raise
            if isinstance(exc, BrokenPipeError) and standard_output_gone():
                raise ReaderGone() from exc
            raise PipeBroken(exc) from exc


def run_command(group: click.Group, argv: list[str] | None) -> int:
    """Run ``group`` and map every error to its exit code, in one place."""
    show_traceback = "--traceback" in (argv if argv is not None else sys.argv[1:])
    try:
        group.main(args=argv, prog_name="sendstream", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return e.EXIT_USAGE
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("sendstream: interrupted", file=sys.stderr)
        return e.EXIT_INTERRUPTED
    except SystemExit as exc:
        return int(exc.code or 0)
    except ReaderGone:
        _quiet_stdout()
        return 0
    except PipeBroken as exc:
        _report(exc.cause, show_traceback, sys.stderr)
        return exc.cause.exit_code if isinstance(exc.cause, e.SendStreamError) else e.EXIT_IO
    except e.SendStreamError as exc:
        _report(exc, show_traceback, sys.stderr)
        return exc.exit_code
    except OSError as exc:
        _report(exc, show_traceback, sys.stderr)
        return e.EXIT_IO
    return 0


def _report(exc: BaseException, show_traceback: bool, err: IO[str]) -> None:
    if show_traceback:
        import traceback

        traceback.print_exc(file=err)
    print(f"sendstream: error: {_words(exc)}", file=err)


def _words(exc: BaseException) -> str:
    """An error as a person reads it: an OSError of ours says itself; another names its file, as cat does,
    without ``[Errno N]``."""
    if isinstance(exc, OSError) and not isinstance(exc, e.SendStreamError) and exc.strerror:
        names = [repr(n) for n in (exc.filename, exc.filename2) if n is not None]
        return f"{' -> '.join(names)}: {exc.strerror}" if names else exc.strerror
    return str(exc)


def _quiet_stdout() -> None:
    # The reader went away (`| head`): drop what is left instead of a second error at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
