"""sendstream: read, check, write and move btrfs send streams.

Every operation of the command line is a function here, with the sans-IO
core under them: :class:`Decoder` takes bytes and returns events,
:class:`Encoder` takes events or commands and returns bytes. (``extract`` is
the extraction package; its operation is :func:`extract_stream`.)
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analysis.changes import SubvolumeChanges as SubvolumeChanges
    from .analysis.changes import changes as changes
    from .analysis.changes import read_changes as read_changes
    from .analysis.resolve import CommandPaths as CommandPaths
    from .analysis.resolve import resolve as resolve
    from .analysis.statistics import Statistics as Statistics
    from .codec.crc import crc32c as crc32c
    from .codec.crc import reference_crc32c as reference_crc32c
    from .codec.decoder import Decoder as Decoder
    from .codec.encoder import Encoder as Encoder
    from .codec.encoder import encode_command as encode_command
    from .codec.encoder import encode_stream_header as encode_stream_header
    from .codec.events import NEED_DATA as NEED_DATA
    from .codec.events import EndOfInput as EndOfInput
    from .codec.events import Event as Event
    from .codec.events import NeedData as NeedData
    from .codec.events import Restart as Restart
    from .codec.events import StreamHeader as StreamHeader
    from .codec.framer import Framer as Framer
    from .endpoints.receiving import accepted as accepted
    from .endpoints.receiving import receive as receive
    from .endpoints.receiving import verify_from_socket as verify_from_socket
    from .endpoints.relay import relay as relay
    from .endpoints.sending import connector as connector
    from .endpoints.sending import send as send
    from .errors import ApplyError as ApplyError
    from .errors import AttributeNotFound as AttributeNotFound
    from .errors import AttributeSize as AttributeSize
    from .errors import BadAttribute as BadAttribute
    from .errors import BadCommand as BadCommand
    from .errors import BadStreamHeader as BadStreamHeader
    from .errors import ChildFailed as ChildFailed
    from .errors import CloneSourceMissing as CloneSourceMissing
    from .errors import CommandTooLarge as CommandTooLarge
    from .errors import CrcMismatch as CrcMismatch
    from .errors import DowngradeError as DowngradeError
    from .errors import DownstreamFailed as DownstreamFailed
    from .errors import DuplicateAttribute as DuplicateAttribute
    from .errors import ExtractError as ExtractError
    from .errors import FormatError as FormatError
    from .errors import HandshakeError as HandshakeError
    from .errors import InputChanged as InputChanged
    from .errors import KeyFileError as KeyFileError
    from .errors import KeyFileUnreadable as KeyFileUnreadable
    from .errors import LimitExceeded as LimitExceeded
    from .errors import MissingAttribute as MissingAttribute
    from .errors import NetworkError as NetworkError
    from .errors import OutputError as OutputError
    from .errors import PrefixDiffers as PrefixDiffers
    from .errors import ProblemLog as ProblemLog
    from .errors import RemoteError as RemoteError
    from .errors import ReplayDiverges as ReplayDiverges
    from .errors import ResumeError as ResumeError
    from .errors import SendStreamError as SendStreamError
    from .errors import SessionError as SessionError
    from .errors import StreamRestarted as StreamRestarted
    from .errors import TlsCause as TlsCause
    from .errors import TlsError as TlsError
    from .errors import TrailingData as TrailingData
    from .errors import TruncatedStream as TruncatedStream
    from .errors import TruncationError as TruncationError
    from .errors import UnknownAttribute as UnknownAttribute
    from .errors import UnknownCommand as UnknownCommand
    from .errors import UnsafePath as UnsafePath
    from .errors import UnsafeValue as UnsafeValue
    from .errors import UsageError as UsageError
    from .extract.extractor import Extractor as Extractor
    from .extract.extractor import extract_stream as extract_stream
    from .extract.report import ExtractReport as ExtractReport
    from .format.command import Command as Command
    from .format.specs import Timespec as Timespec
    from .io.windows import file_events as file_events
    from .io.windows import iter_events as iter_events
    from .ops.convert import convert as convert
    from .ops.downgrade import Downgrader as Downgrader
    from .ops.events import events as events
    from .ops.repair import Healer as Healer
    from .ops.repair import repair as repair
    from .ops.verify import Report as Report
    from .ops.verify import find_headers as find_headers
    from .ops.verify import verify as verify
    from .ops.verify import verify_file as verify_file
    from .render.changes import write_changes as write_changes
    from .render.dump import dump as dump
    from .render.paths import write_paths as write_paths
    from .render.paths import write_stats as write_stats
    from .transfer.identity import stream_identity as stream_identity
    from .transfer.progress import Progress as Progress
    from .transfer.progress import Summary as Summary
    from .transfer.sinks import ChildSink as ChildSink
    from .transfer.sinks import FileSink as FileSink
    from .transfer.sinks import JournalSink as JournalSink
    from .transfer.sinks import Sink as Sink
    from .transfer.sinks import Target as Target
    from .transport.address import Address as Address
    from .transport.address import Dialing as Dialing
    from .transport.address import Listening as Listening
    from .transport.address import TlsSettings as TlsSettings

__version__ = "0.1.0"

# Where each public name lives: loaded on first use, so that `import
# sendstream.cli` (every command's start-up) pays only for what it runs.
_HOME = {
    "SubvolumeChanges": ("analysis.changes", "SubvolumeChanges"),
    "changes": ("analysis.changes", "changes"),
    "read_changes": ("analysis.changes", "read_changes"),
    "CommandPaths": ("analysis.resolve", "CommandPaths"),
    "resolve": ("analysis.resolve", "resolve"),
    "Statistics": ("analysis.statistics", "Statistics"),
    "crc32c": ("codec.crc", "crc32c"),
    "reference_crc32c": ("codec.crc", "reference_crc32c"),
    "Decoder": ("codec.decoder", "Decoder"),
    "Encoder": ("codec.encoder", "Encoder"),
    "encode_command": ("codec.encoder", "encode_command"),
    "encode_stream_header": ("codec.encoder", "encode_stream_header"),
    "EndOfInput": ("codec.events", "EndOfInput"),
    "Event": ("codec.events", "Event"),
    "NEED_DATA": ("codec.events", "NEED_DATA"),
    "NeedData": ("codec.events", "NeedData"),
    "Restart": ("codec.events", "Restart"),
    "StreamHeader": ("codec.events", "StreamHeader"),
    "Framer": ("codec.framer", "Framer"),
    "ApplyError": ("errors", "ApplyError"),
    "AttributeNotFound": ("errors", "AttributeNotFound"),
    "AttributeSize": ("errors", "AttributeSize"),
    "BadAttribute": ("errors", "BadAttribute"),
    "BadCommand": ("errors", "BadCommand"),
    "BadStreamHeader": ("errors", "BadStreamHeader"),
    "ChildFailed": ("errors", "ChildFailed"),
    "CloneSourceMissing": ("errors", "CloneSourceMissing"),
    "CommandTooLarge": ("errors", "CommandTooLarge"),
    "CrcMismatch": ("errors", "CrcMismatch"),
    "DowngradeError": ("errors", "DowngradeError"),
    "DownstreamFailed": ("errors", "DownstreamFailed"),
    "DuplicateAttribute": ("errors", "DuplicateAttribute"),
    "ExtractError": ("errors", "ExtractError"),
    "FormatError": ("errors", "FormatError"),
    "HandshakeError": ("errors", "HandshakeError"),
    "InputChanged": ("errors", "InputChanged"),
    "KeyFileError": ("errors", "KeyFileError"),
    "KeyFileUnreadable": ("errors", "KeyFileUnreadable"),
    "LimitExceeded": ("errors", "LimitExceeded"),
    "MissingAttribute": ("errors", "MissingAttribute"),
    "NetworkError": ("errors", "NetworkError"),
    "OutputError": ("errors", "OutputError"),
    "PrefixDiffers": ("errors", "PrefixDiffers"),
    "ProblemLog": ("errors", "ProblemLog"),
    "RemoteError": ("errors", "RemoteError"),
    "ReplayDiverges": ("errors", "ReplayDiverges"),
    "ResumeError": ("errors", "ResumeError"),
    "SendStreamError": ("errors", "SendStreamError"),
    "SessionError": ("errors", "SessionError"),
    "StreamRestarted": ("errors", "StreamRestarted"),
    "TlsCause": ("errors", "TlsCause"),
    "TlsError": ("errors", "TlsError"),
    "TrailingData": ("errors", "TrailingData"),
    "TruncatedStream": ("errors", "TruncatedStream"),
    "TruncationError": ("errors", "TruncationError"),
    "UnknownAttribute": ("errors", "UnknownAttribute"),
    "UnknownCommand": ("errors", "UnknownCommand"),
    "UnsafePath": ("errors", "UnsafePath"),
    "UnsafeValue": ("errors", "UnsafeValue"),
    "UsageError": ("errors", "UsageError"),
    "Extractor": ("extract.extractor", "Extractor"),
    "ExtractReport": ("extract.report", "ExtractReport"),
    "Command": ("format.command", "Command"),
    "Timespec": ("format.specs", "Timespec"),
    "events": ("ops.events", "events"),
    "file_events": ("io.windows", "file_events"),
    "iter_events": ("io.windows", "iter_events"),
    "Address": ("transport.address", "Address"),
    "Dialing": ("transport.address", "Dialing"),
    "Listening": ("transport.address", "Listening"),
    "TlsSettings": ("transport.address", "TlsSettings"),
    "Progress": ("transfer.progress", "Progress"),
    "Summary": ("transfer.progress", "Summary"),
    "accepted": ("endpoints.receiving", "accepted"),
    "receive": ("endpoints.receiving", "receive"),
    "verify_from_socket": ("endpoints.receiving", "verify_from_socket"),
    "relay": ("endpoints.relay", "relay"),
    "connector": ("endpoints.sending", "connector"),
    "send": ("endpoints.sending", "send"),
    "ChildSink": ("transfer.sinks", "ChildSink"),
    "FileSink": ("transfer.sinks", "FileSink"),
    "JournalSink": ("transfer.sinks", "JournalSink"),
    "Sink": ("transfer.sinks", "Sink"),
    "Target": ("transfer.sinks", "Target"),
    "convert": ("ops.convert", "convert"),
    "Downgrader": ("ops.downgrade", "Downgrader"),
    "stream_identity": ("transfer.identity", "stream_identity"),
    "Healer": ("ops.repair", "Healer"),
    "repair": ("ops.repair", "repair"),
    "Report": ("ops.verify", "Report"),
    "find_headers": ("ops.verify", "find_headers"),
    "verify": ("ops.verify", "verify"),
    "verify_file": ("ops.verify", "verify_file"),
    "write_changes": ("render.changes", "write_changes"),
    "dump": ("render.dump", "dump"),
    "write_paths": ("render.paths", "write_paths"),
    "write_stats": ("render.paths", "write_stats"),
    "extract_stream": ("extract.extractor", "extract_stream"),
}
__all__ = sorted(_HOME)


class _Package(types.ModuleType):
    """This package: each public name loads on first use. (Methods, not module functions, so that
    ``help(sendstream)`` lists the public API only.)"""

    def __getattr__(self, name: str) -> Any:
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module 'sendstream' has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{home[0]}", __name__), home[1])
        setattr(self, name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted([*globals(), *__all__])


sys.modules[__name__].__class__ = _Package
