"""The sender's offer to compress, on a new channel: one line out, the receiver's answer back, both through
the session machine (:class:`~.protocol.SenderConnection`)."""

from __future__ import annotations

import time

from .. import errors as e
from ..transport.compression import METHOD, Compressing, Tally
from ..transport.tls import Channel
from .connection import Inbox
from .protocol import CompressAnswer, CompressOffer, SenderConnection, Status

ANSWER_BUFFER = 4096  # the receiver says nothing more until we speak again


def offer(channel: Channel, tally: Tally, seconds: float) -> Channel:
    """Offer zstd on a new ``channel``; the channel to send on from now on: one that compresses
    (:class:`~sendstream.transport.compression.Compressing`) when the receiver takes it, else ``channel``.

    The answer comes within ``seconds``. A receiver that answers ``none``
    gets the plain bytes; one that refuses (an older sendstream) or says
    nothing is an error that says so.
    """
    machine = SenderConnection()
    channel.set_deadline(time.monotonic() + seconds)
    channel.send_all(machine.send(CompressOffer(METHOD)))
    try:
        answer = Inbox(channel, machine, ANSWER_BUFFER).next_event()
    except TimeoutError:
        raise e.RemoteError(
            f"the receiver did not answer the offer to compress within {seconds:g} s "
            "(is it sendstream? --compress needs a sendstream receiver)",
            e.EXIT_IO,
        ) from None
    except EOFError:
        raise e.SessionError("the receiver closed the connection instead of answering the offer to compress") from None
    finally:
        channel.set_deadline(None)
    if isinstance(answer, Status):
        raise e.RemoteError(
            f"the receiver refused to take a compressed stream ({answer.message}); "
            "it may be an older sendstream: send without --compress",
            answer.code or e.EXIT_IO,
        )
    assert isinstance(answer, CompressAnswer)  # the machine's: an offer gets nothing else
    if answer.method == METHOD:
        return Compressing(channel, tally)
    tally.refused = True
    return channel
