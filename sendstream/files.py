"""The file layer: open inputs and outputs, feed the decoder from them."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

from .decoder import Decoder, EndOfInput, Event, NeedData

CHUNK_SIZE = 1 << 20


def open_input(path: str) -> BinaryIO:
    """A binary file for ``path``; ``-`` is standard input."""
    if path == "-":
        return sys.stdin.buffer
    return open(path, "rb")


def iter_events(source: BinaryIO, decoder: Decoder | None = None, chunk_size: int = CHUNK_SIZE) -> Iterator[Event]:
    """Every event of ``source``, read in chunks, up to :class:`EndOfInput`."""
    decoder = decoder or Decoder()
    while True:
        event = decoder.next_event()
        if isinstance(event, NeedData):
            decoder.receive_data(source.read(chunk_size))
            continue
        yield event
        if isinstance(event, EndOfInput):
            return


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[BinaryIO]:
    """Write ``path`` through a temporary file renamed into place on success.

    On an error nothing is left behind, and an existing file is untouched.
    ``-`` writes to standard output directly.
    """
    if path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".sendstream-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
