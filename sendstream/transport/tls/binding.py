"""A TLS library's binding, made once on first use; a library that cannot be loaded is a TlsError."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from ...errors import TlsCause, TlsError

_B = TypeVar("_B")


class Binding(Generic[_B]):
    """The binding ``make`` returns, made on the first call and shared by every later one."""

    def __init__(self, make: Callable[[], _B], failure: str) -> None:
        self._make = make
        self._failure = failure  # the message; "{}" is the loader's error
        self._loaded: _B | None = None
        self._lock = threading.Lock()

    def __call__(self) -> _B:
        with self._lock:
            if self._loaded is None:
                try:
                    self._loaded = self._make()
                except OSError as exc:
                    raise TlsError(self._failure.format(exc), TlsCause.SETUP) from exc
            return self._loaded

    def why_unavailable(self) -> str | None:
        """Why the library cannot be loaded, or None when it can."""
        try:
            self()
        except TlsError as exc:
            return str(exc)
        return None
