"""``sendstream serve`` as a long-running process: its heap set before any thread, SIGTERM and SIGINT
to stop (the running transfers get their grace), SIGHUP to read the configuration again, and the
metrics endpoint for as long as it runs."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from ..transport.address import Address
from .config import Config
from .log import EventLog
from .memory import settle_malloc
from .server import Service

Handler = Callable[[int, Any], Any]


def serve_until_stopped(config: Config, log: EventLog, metrics: str | None, again: Handler) -> None:
    """Run the service of ``config`` until a stop signal (then ``again`` handles a second SIGINT; a second
    SIGTERM ends the process at once); ``metrics``: ``HOST:PORT`` for Prometheus scrapes, or None."""
    settle_malloc()  # before any thread: a heap that gives large buffers back (memory.py)
    stop, hangup = threading.Event(), threading.Event()

    def stopping(signum: int, frame: object) -> None:
        stop.set()
        signal.signal(signal.SIGINT, again)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    signal.signal(signal.SIGHUP, lambda signum, frame: hangup.set())  # the service reloads between connections
    counted = None
    if metrics is not None:
        from .metrics import Metrics  # (prometheus_client, only when asked for)

        counted = Metrics()
        address = Address.parse(metrics, listen=True)
        log("metrics", address=f"{address.host}:{counted.serve(address)}")
    try:
        Service(config, log, counted).run(stop, hangup)
    finally:
        if counted is not None:
            counted.close()
