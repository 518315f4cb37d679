"""The service's event log: one line per event, ``key=value`` text or JSON lines."""

from __future__ import annotations

import datetime
import json
import threading
from typing import IO, Any

from .. import errors as e


class EventLog:
    """One line per event, plain ``key=value`` text or JSON lines, safe from every thread; a value that is
    no printable text (a name: any bytes) is escaped (:func:`~sendstream.errors.escaped`)."""

    def __init__(self, stream: IO[str], fmt: str = "text") -> None:
        self._stream = stream
        self._json = fmt == "json"
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        when = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
        if self._json:
            shown = {k: e.escaped(v) if isinstance(v, str) else v for k, v in fields.items()}
            line = json.dumps({"time": when, "event": event, **shown}, sort_keys=False)
        else:
            line = " ".join([when, event, *(f"{k}={_text(v)}" for k, v in fields.items())])
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


def _text(value: Any) -> str:
    text = e.escaped(str(value))
    return json.dumps(text) if not text or any(c.isspace() or c in '"=' for c in text) else text
