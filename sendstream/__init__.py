"""sendstream: read, check, write and move btrfs send streams.

The core is sans-IO: :class:`Decoder` takes bytes and returns events,
:class:`Encoder` takes events or commands and returns bytes.
"""

from .command import Command
from .crc import crc32c, reference_crc32c
from .decoder import NEED_DATA, Decoder, EndOfInput, Framer, NeedData, Restart, StreamHeader
from .encoder import Encoder, encode_command, encode_stream_header
from .errors import FormatError, SendStreamError, UsageError
from .files import events
from .format import Timespec
from .verify import Report, verify_file

__version__ = "0.1.0"

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
