"""Dask worker plugins of the tests, imported by name on the workers (their PYTHONPATH holds tests/)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import distributed


class HoldFirstTask(distributed.WorkerPlugin):  # type: ignore[misc]
    """A worker plugin: the first task any worker of the cluster starts writes ``marker`` (its worker's pid
    and the task's key) and holds that worker's event loop, so that its result cannot reach the scheduler
    before the test kills the worker. Registered by the test with ``client.register_plugin``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish != "executing":
            return
        try:
            fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        os.write(fd, json.dumps({"pid": os.getpid(), "key": str(key)}).encode())
        os.close(fd)
        time.sleep(120)  # the test kills this process long before; on its own it would only be slow
