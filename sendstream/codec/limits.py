"""How large one command may be: the kernel's limit for each stream version, and the largest a caller may set."""

from __future__ import annotations

from ..format.layout import MAX_VERSION, SEND_BUF_SIZE

# The largest --max-command-size: a command is held whole in memory before it is checked.
MAX_COMMAND_SIZE = 256 << 20  # (the library takes any limit its caller chooses)


def default_max_command_size(version: int) -> int:
    """The largest payload the kernel can write in a stream of ``version``."""
    return SEND_BUF_SIZE[min(max(version, 1), MAX_VERSION)]
