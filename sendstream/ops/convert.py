"""Rewriting a stream through the encoder, as it is or as a v1 stream (:mod:`.downgrade`)."""

from __future__ import annotations

from ..analysis.paths import MAX_NAMES
from ..codec.encoder import Encoder
from ..codec.events import Restart
from ..errors import UsageError
from ..io.framed import FramedInput, StreamSource, Warn
from ..io.outputs import atomic_output
from .downgrade import MAX_ZERO_FILL, Downgrader


def convert(
    source: StreamSource,
    target: str,
    *,
    to_version: int | None = None,
    max_zero_fill: int = MAX_ZERO_FILL,
    max_names: int = MAX_NAMES,
    max_command_size: int | None = None,
    warn: Warn | None = None,
) -> None:
    """Rewrite the stream at ``source`` into the file ``target`` (``-``: standard output)
    through the encoder; ``target`` appears only when the whole input was read without error.

    As it is, a valid input comes out byte for byte. With ``to_version=1`` it becomes
    a v1 stream (see :class:`~sendstream.ops.downgrade.Downgrader`, which the limits
    are for); what that drops or changes goes to ``warn``, as the input's problems do.
    A restarted input is refused: :func:`~sendstream.ops.repair.repair` it first.
    """
    if to_version not in (None, 1):
        raise UsageError(f"a stream converts to version 1 only, not {to_version}")
    downgrader = None
    if to_version is not None:
        downgrader = Downgrader(warn=warn, max_zero_fill=max_zero_fill, max_names=max_names)
    encoder = Encoder()
    with FramedInput(source, max_command_size=max_command_size, warn=warn) as stream, atomic_output(target) as out:
        for event in stream.events(flush_before_read=out):
            if isinstance(event, Restart):
                raise event.error(stream.framer.commands)
            if downgrader is None:
                out.write(encoder.send(event))
            else:
                for converted in downgrader.events(event):
                    out.write(encoder.send(converted))
