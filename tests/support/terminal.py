"""A pseudo-terminal for a process, and what it showed there: a person's screen, for the tests."""

from __future__ import annotations

import os
import pty
import threading


class Pty:
    """Give :attr:`slave` to a process (stdin, stdout or stderr), then call :meth:`started`;
    :meth:`text` is everything the process wrote there once it has closed the terminal."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.shown = bytearray()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def started(self) -> None:
        os.close(self.slave)  # the process holds it now: EIO comes once the process is gone
        self._watcher.start()

    def _watch(self) -> None:
        try:
            while chunk := os.read(self.master, 4096):
                self.shown.extend(chunk)
        except OSError:
            pass

    def text(self) -> str:
        self._watcher.join(5)
        os.close(self.master)
        return self.shown.decode(errors="replace")
