"""The command line: a thin layer over the library.

Errors become exit codes in one place (:func:`main`); see the README's
table of exit codes.
"""

from __future__ import annotations

import sys
import traceback
from typing import IO, Any, BinaryIO

import click

from . import __version__
from . import errors as e
from .command import Command
from .crc import IMPLEMENTATION
from .decoder import Framer, Restart, StreamHeader
from .dump import TextDumper, json_line
from .encoder import Encoder
from .files import FlushBeforeRead, atomic_output, file_events, is_regular, open_input
from .format import MAX_VERSION
from .native import PATH
from .repair import Healer
from .verify import find_headers, verify_file


def _max_size_option(f: Any) -> Any:
    return click.option(
        "--max-command-size",
        type=click.IntRange(min=0),
        default=None,
        metavar="BYTES",
        help="Largest command payload accepted (default: the kernel's limit for the stream's version).",
    )(f)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sendstream")
@click.option("--traceback", "show_traceback", is_flag=True, help="Show a Python traceback on errors.")
@click.pass_context
def cli(ctx: click.Context, show_traceback: bool) -> None:
    """Read, check, convert and move btrfs send streams."""
    ctx.obj = {"traceback": show_traceback}


def _warn(problems: list[e.FormatError], shown: int) -> int:
    for problem in problems[shown:]:
        click.echo(f"sendstream: warning: {problem}", err=True)
    return len(problems)


@cli.command()
@click.argument("stream", default="-")
@click.option("--json", "as_json", is_flag=True, help="JSON lines: one object per command.")
@click.option("--strict", is_flag=True, help="Reject commands and attributes unknown to the stream's version.")
@_max_size_option
def dump(stream: str, as_json: bool, strict: bool, max_command_size: int | None) -> None:
    """Print every command of STREAM (a file or -), like `btrfs receive --dump`."""
    out = sys.stdout.buffer
    framer = Framer(strict=strict, max_command_size=max_command_size)
    text = TextDumper()
    batch = None if as_json else text.native_batch(out)
    version = 0
    warned = 0
    with open_input(stream) as source:
        try:
            for event in file_events(source, framer, batch):
                if isinstance(event, StreamHeader):
                    version = event.version
                elif isinstance(event, Command):
                    out.write(json_line(event, framer.streams, version) if as_json else text.line(event))
                    if len(framer.problems) > warned:
                        warned = _warn(framer.problems, warned)
        finally:
            out.flush()


@cli.command()
@click.argument("stream", default="-")
@click.option("--keep-going", is_flag=True, help="Report every problem, not only the first.")
@click.option("--scan", is_flag=True, help="Only list every stream header in STREAM, wherever it is.")
@click.option("-q", "--quiet", is_flag=True, help="No summary line.")
@click.option("-v", "--verbose", is_flag=True, help="Say which verifier and CRC implementation ran.")
@_max_size_option
def verify(stream: str, keep_going: bool, scan: bool, quiet: bool, verbose: bool, max_command_size: int | None) -> None:
    """Check STREAM (a file or -): framing, CRCs, commands, attributes, END."""
    if verbose:
        click.echo(f"sendstream: verifier: {PATH}; crc32c: {IMPLEMENTATION}", err=True)
    if scan:
        with open_input(stream) as source:
            headers = list(find_headers(source))
        for offset, version in headers:
            valid = "" if 1 <= version <= MAX_VERSION else " (not a valid version)"
            click.echo(f"offset {offset}: stream header, version {version}{valid}")
        if not quiet:
            click.echo(f"{len(headers)} stream header{'s' * (len(headers) != 1)}")
        return
    with open_input(stream) as source:
        report = verify_file(source, keep_going=keep_going, max_command_size=max_command_size)
    for problem in report.problems:
        click.echo(f"sendstream: error: {problem}", err=True)
    if not quiet:
        rate = report.bytes / report.seconds / 1e6 if report.seconds else 0.0
        status = "OK" if report.ok else f"FAILED ({len(report.problems)} problem{'s' * (len(report.problems) != 1)})"
        click.echo(
            f"{status}: {report.streams} stream{'s' * (report.streams != 1)}, {report.commands} commands, "
            f"{report.bytes} bytes in {report.seconds:.3f} s ({rate:.1f} MB/s)"
        )
    sys.exit(report.exit_code)


@cli.command()
@click.argument("source", metavar="IN")
@click.argument("target", metavar="OUT")
@_max_size_option
def convert(source: str, target: str, max_command_size: int | None) -> None:
    """Rewrite stream IN into OUT (- for stdin/stdout) through the writer.

    With no options the output is byte-identical to a valid input. A file
    OUT appears only when the whole input was read without error.
    """
    encoder = Encoder()
    framer = Framer(max_command_size=max_command_size)
    with open_input(source) as inp, atomic_output(target) as out:
        for event in file_events(inp, framer):
            if isinstance(event, Restart):
                raise framer.problems[-1]
            out.write(encoder.send(event))
    _warn(framer.problems, 0)


@cli.command()
@click.argument("source", metavar="IN")
@click.argument("target", metavar="OUT")
@click.option("--keep-last", is_flag=True, help="Keep only what follows the last restart (OUT must be seekable).")
@click.option("-q", "--quiet", is_flag=True, help="No summary line.")
@_max_size_option
def repair(source: str, target: str, keep_last: bool, quiet: bool, max_command_size: int | None) -> None:
    """Write the clean stream of IN (a restarted `btrfs send`) to OUT (- for stdin/stdout).

    Each command goes out only after its CRC is checked. After a restart the
    replayed commands must match those already written (length and CRC);
    they are dropped with the partial command before the restart. A file OUT
    appears only when the whole input was repaired.
    """
    framer = Framer(max_command_size=max_command_size)
    with open_input(source) as inp, atomic_output(target) as out:
        if keep_last and not out.seekable():
            raise e.UsageError("--keep-last needs OUT to be a file")

        def truncate(offset: int) -> None:
            out.flush()
            out.seek(offset)
            out.truncate(offset)

        healer = Healer(out.write, keep_last=keep_last, truncate=truncate if keep_last else None)
        reader = inp if is_regular(inp) else FlushBeforeRead(inp, out)
        for event in file_events(reader, framer, healer.batch):  # type: ignore[arg-type]
            healer.event(event)
    _warn([p for p in framer.problems if not isinstance(p, e.StreamRestarted)], 0)
    if not quiet:
        for r in healer.restarts:
            click.echo(
                f"sendstream: restart at offset {r.offset} after {r.commands} complete commands, "
                f"{r.partial} bytes of a partial command before it",
                err=True,
            )
        click.echo(
            f"sendstream: {len(healer.restarts)} restart{'s' * (len(healer.restarts) != 1)} repaired; "
            f"{healer.written} bytes written, {healer.dropped} dropped",
            err=True,
        )


def _report(exc: BaseException, show_traceback: bool, err: IO[str]) -> None:
    if show_traceback:
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
    except BrokenPipeError:
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
