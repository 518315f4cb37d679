"""``python -m sendstream`` and the ``sendstream`` command."""

import contextlib
import os
import signal
import sys


def _interrupted_while_loading(signum: int, frame: object) -> None:
    os.write(2, b"sendstream: interrupted\n")  # nothing is open yet: there is nothing to finish
    os._exit(130)  # errors.EXIT_INTERRUPTED, not imported: this runs before anything is


def run() -> None:
    """Console-script entry point; a Ctrl-C while Python loads the CLI ends as one later does."""
    signal.signal(signal.SIGINT, _interrupted_while_loading)
    from .io.pipes import widen

    for fd in (0, 1):
        widen(fd)  # the writer before us runs on into the wider pipe while Python loads (~0.1 s)
    from .cli import main
    from .cli.terminal import interrupted

    signal.signal(signal.SIGINT, interrupted)
    code = main()
    if code == 130:
        # CPython kills itself by SIGINT at exit when the interrupt once left code it ran (its flag
        # _Py_UnhandledKeyboardInterrupt), even though we caught it: 3 of 40 runs ended -2, not 130.
        # Every output is already closed or removed; only the standard streams are left.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
