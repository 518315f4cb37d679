"""sendstream: read, check, write and move btrfs send streams.

The core is sans-IO: :class:`Decoder` takes bytes and returns events,
:class:`Encoder` takes events or commands and returns bytes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .codec.crc import crc32c, reference_crc32c
    from .codec.decoder import Decoder
    from .codec.encoder import Encoder, encode_command, encode_stream_header
    from .codec.events import NEED_DATA, EndOfInput, NeedData, Restart, StreamHeader
    from .codec.framer import Framer
    from .errors import FormatError, SendStreamError, UsageError
    from .format.command import Command
    from .format.specs import Timespec
    from .io.windows import events
    from .ops.verify import Report, verify_file

__version__ = "0.1.0"

# Where each public name lives: loaded on first use, so that `import
# sendstream.cli` (every command's start-up) pays only for what it runs.
_HOME = {
    "NEED_DATA": "codec.events",
    "Command": "format.command",
    "Decoder": "codec.decoder",
    "Encoder": "codec.encoder",
    "EndOfInput": "codec.events",
    "FormatError": "errors",
    "Framer": "codec.framer",
    "NeedData": "codec.events",
    "Report": "ops.verify",
    "Restart": "codec.events",
    "SendStreamError": "errors",
    "StreamHeader": "codec.events",
    "Timespec": "format.specs",
    "UsageError": "errors",
    "crc32c": "codec.crc",
    "encode_command": "codec.encoder",
    "encode_stream_header": "codec.encoder",
    "events": "io.windows",
    "reference_crc32c": "codec.crc",
    "verify_file": "ops.verify",
}
__all__ = [
    "NEED_DATA",
    "Command",
    "Decoder",
    "Encoder",
    "EndOfInput",
    "FormatError",
    "Framer",
    "NeedData",
    "Report",
    "Restart",
    "SendStreamError",
    "StreamHeader",
    "Timespec",
    "UsageError",
    "crc32c",
    "encode_command",
    "encode_stream_header",
    "events",
    "reference_crc32c",
    "verify_file",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'sendstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
