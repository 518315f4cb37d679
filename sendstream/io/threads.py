"""Background threads that an interrupt cannot leave half made."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def started(target: Callable[..., object], *args: Any) -> threading.Thread:
    """A daemon thread running ``target(*args)``, already started.

    The caller stores the thread only once it runs: a Ctrl-C between making a
    thread and starting it would otherwise leave an attribute that a cleanup
    joins ("cannot join thread before it is started").
    """
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread
