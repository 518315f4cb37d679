"""The events of a stream for a script: healed of ``btrfs send`` restarts unless asked for raw."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import BinaryIO

from ..codec.events import Event
from ..codec.framer import Framer
from ..io.windows import events as raw_events
from .repair import healed


def events(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO | socket.socket,
    framer: Framer | None = None,
    *,
    raw: bool = False,
) -> Iterator[Event]:
    """Every event of a stream from a path, bytes, a binary file or a socket.

    A restarted send (a second header in the middle) yields its ``Restart``
    and then only what is new: the replayed commands are checked against
    those before the restart and dropped, as ``repair`` drops them, so that
    counting what the commands write counts each byte once. ``raw=True``
    gives every event as it is in the input. Command values are views into
    the input: copy what you keep beyond the next event.
    """
    stream = raw_events(source, framer)
    return stream if raw else healed(stream)
