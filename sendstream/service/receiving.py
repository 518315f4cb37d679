"""A client's stream into its ``btrfs receive`` place: confined (:mod:`.confine`), journaled (resumable),
the subvolumes a failed run began deleted."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

from ..net.journal import PART_SUFFIX, Journal
from ..net.progress import NONE, Progress
from ..net.receiving import receive_resumable
from ..net.session.receiver import SessionReceiver
from ..net.sinks import ChildSink
from ..ops.ledger import Checkpoint, Ledger
from .config import Client
from .confine import UuidGuard, leftover
from .journals import Charge, incoming_name


def receive_into(
    session: SessionReceiver,
    client: Client,
    claim: Callable[[uuid.UUID, str], object],
    checkpoint: Checkpoint | None = None,
    charge: Charge | None = None,
    say: Callable[[str], object] = lambda line: None,
) -> tuple[str, int, tuple[str, ...]]:
    """Check the stream of ``session`` and give it to ``btrfs receive`` in ``client``'s place, its paths and
    UUIDs confined (:class:`~sendstream.service.confine.UuidGuard`); the subvolumes made, and the size. What
    ``btrfs receive`` writes on stderr goes to ``say``, line by line.

    A session's stream is journaled as :func:`store` journals it, so that the same stream sent again
    continues from ``checkpoint``: ``btrfs receive`` cannot continue what an earlier run began, so the
    subvolumes that run left are deleted and the kept part is given to a new ``btrfs receive`` again
    before the session's bytes. On any failure the subvolumes this run began are deleted; the journal stays.
    What is written is counted by ``charge`` first (against the client's quota).
    """
    made: list[str] = []
    journal, again, ledger = None, False, None
    if not session.raw:
        assert session.identity is not None
        path = os.path.join(client.place, incoming_name(session.identity))
        again = os.path.lexists(path + PART_SUFFIX)  # an earlier run of this stream was cut
        journal, ledger = Journal(path, client.key, checkpoint), Ledger(checkpoint)

    def claimed(subvolume: uuid.UUID, name: str) -> None:
        path = os.path.join(client.place, name)
        # what an earlier run began from the kept part (or, cut before its first checkpoint, its first)
        earlier = journal is not None and (guard.offset < journal.offset or (again and not made))
        if earlier and leftover(path, subvolume):
            _delete_subvolume(path)
        claim(subvolume, name)
        made.append(name)

    guard = UuidGuard(client.place, claimed)
    command = shlex.join(["btrfs", "receive", "--chroot", client.place])
    try:
        with ChildSink(command, stderr=say, stdout_too=True) as child, guard:

            def replay(data: Any) -> None:
                guard(data)
                child.write(data)

            def write(data: Any) -> None:
                if charge is not None:
                    charge(len(data))
                replay(data)
                if journal is not None:
                    journal.write(data)

            session.flush = child.flush
            progress = Progress("received", mode=NONE)
            summary = receive_resumable(session, write, progress, journal, ledger, replay=replay)
    except BaseException:
        if journal is not None and ledger is not None:
            journal.stop(session.written, session.identity, ledger)
        for name in made:
            _delete_subvolume(os.path.join(client.place, name))
        raise
    if journal is not None:
        journal.discard()
    return ", ".join(made), summary.bytes + summary.skipped, tuple(made)


def _delete_subvolume(path: str) -> None:
    """Delete the subvolume at ``path`` that a failed transfer began (nothing when there is none)."""
    with contextlib.suppress(OSError):
        if os.lstat(path).st_ino == 256:
            subprocess.run(["btrfs", "-q", "subvolume", "delete", path], capture_output=True, check=False)
