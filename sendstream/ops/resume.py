"""Resuming across restarts of either side: ledgers, tokens and the receiver's journal.

A :class:`Ledger` digests the length and CRC of every command written (and
the version of every stream header), in order, so two runs of the same
stream agree on it up to any command boundary, and a different stream does
not. A receiver writing to ``FILE`` in a session keeps ``FILE.part`` and, in
``FILE.part.resume``, a *resume token*: the stream's identity (the session
hello's), the offset of the last command boundary it made durable (fsync),
the command count and the ledger digest there, authenticated with an
HMAC-SHA-256 keyed by the pre-shared key. ``sendstream send --resume TOKEN``
reads the stream again from the start, checks it is the token's stream (the
identity, and the ledger at the token's offset) and sends only the rest;
``sendstream receive --resume`` truncates ``FILE.part`` to that offset,
checks the kept prefix again against the ledger, and carries on.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import io
import json
import os
import re
import sys
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import errors as e
from ..errors import PrefixDiffers, ResumeError, SessionError
from ..format.layout import COMMAND_HEADER_SIZE, STREAM_HEADER_SIZE
from ..io.outputs import OutputDirectory, OutputFile
from .identity import MAX_OFFSET, check_identity, load_json

TOKEN_PREFIX = "ssr1."
STATE_SUFFIX = ".resume"
PART_SUFFIX = ".part"
CHECKPOINT_BYTES = 16 << 20  # durable at least this often: well inside the sender's 64 MiB window
CHECKPOINT_SECONDS = 1.0
_TOKEN_FIELDS = {"stream", "offset", "commands", "ledger"}
_LEDGER = re.compile("[0-9a-f]{64}")
_HEADER_MARK = 0xFFFFFFFF  # in the lengths digest: a stream header (no command is that long)
_MAX_TOKEN = 8192


@dataclass(frozen=True)
class Checkpoint:
    """Where a receiver stands: a command boundary of one stream."""

    stream: dict[str, Any]
    offset: int
    commands: int
    ledger: str


class Ledger:
    """The digest of every command written so far (length and CRC, in order).

    With ``expect``, the digest is compared when the written offset reaches
    ``expect.offset``, which must be a command boundary.
    """

    def __init__(self, expect: Checkpoint | None = None) -> None:
        self.offset = 0
        self.commands = 0
        self._lens = hashlib.sha256()
        self._crcs = hashlib.sha256()
        self._expect = expect
        if expect is not None and expect.offset == 0:
            self._check()

    def digest(self) -> str:
        return hashlib.sha256(b"sendstream-ledger-1" + self._lens.digest() + self._crcs.digest()).hexdigest()

    def header(self, version: int) -> None:
        self._add(array("I", [_HEADER_MARK]), array("I", [version]), STREAM_HEADER_SIZE, 0)

    def run(self, lens: array[int], crcs: array[int]) -> None:
        """Commands about to be written: their payload lengths and CRCs."""
        size = sum(lens) + COMMAND_HEADER_SIZE * len(lens)
        target = self._expect.offset if self._expect is not None else -1
        if self.offset < target < self.offset + size:
            k, acc = 0, self.offset
            while acc < target:
                acc += lens[k] + COMMAND_HEADER_SIZE
                k += 1
            if acc != target:
                start = acc - lens[k - 1] - COMMAND_HEADER_SIZE
                self._differs(f"a command boundary at offset {target}", f"a command from offset {start}")
            self._add(lens[:k], crcs[:k], acc - self.offset, k)
            lens, crcs, size = lens[k:], crcs[k:], size - (acc - self.offset)
        self._add(lens, crcs, size, len(lens))

    def finish(self) -> None:
        """The stream ended: fail if it never reached the expected offset."""
        if self._expect is not None:
            self._differs(f"at least {self._expect.offset} bytes", f"the stream ends at {self.offset}")

    def _add(self, lens: array[int], crcs: array[int], size: int, commands: int) -> None:
        if lens:
            self._lens.update(_little_endian(lens))
            self._crcs.update(_little_endian(crcs))
        self.offset += size
        self.commands += commands
        if self._expect is not None and self.offset >= self._expect.offset:
            if self.offset > self._expect.offset:
                self._differs(f"a stream header or command boundary at offset {self._expect.offset}", self.offset)
            self._check()

    def _check(self) -> None:
        assert self._expect is not None
        expect, self._expect = self._expect, None
        if (self.commands, self.digest()) != (expect.commands, expect.ledger):
            raise PrefixDiffers(
                f"the stream differs from the token's before offset {expect.offset}: "
                "other command lengths or CRCs (not the same snapshot, or a changed file)",
                offset=expect.offset,
                index=self.commands,
                expected=f"{expect.commands} commands with ledger {expect.ledger[:16]}",
                actual=f"{self.commands} commands with ledger {self.digest()[:16]}",
            )

    def _differs(self, expected: str, actual: object) -> None:
        assert self._expect is not None
        offset = self._expect.offset
        self._expect = None
        raise PrefixDiffers(
            f"the stream differs from the token's: offset {offset} is not where it was",
            offset=offset,
            index=self.commands,
            expected=expected,
            actual=actual,
        )


def _little_endian(values: array[int]) -> bytes:
    """The 32-bit values as little-endian bytes: tokens travel between machines."""
    if sys.byteorder == "big":
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def after(offset: int, write: Callable[[Any], object]) -> Callable[[Any], None]:
    """``write`` for the bytes from stream offset ``offset`` on; earlier ones are dropped."""
    position = 0

    def gate(data: Any) -> None:
        nonlocal position
        n = len(data)
        if position + n <= offset:
            position += n
            return
        skip = max(0, offset - position)
        position += n
        write(memoryview(data)[skip:] if skip else data)

    return gate


# --- tokens ---------------------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, payload: bytes) -> bytes:
    token_key = hmac.new(key, b"sendstream resume token 1", hashlib.sha256).digest()
    return hmac.new(token_key, payload, hashlib.sha256).digest()


def make_token(checkpoint: Checkpoint, key: bytes) -> str:
    """The checkpoint as text, authenticated with ``key`` (the pre-shared key)."""
    fields = {"stream": checkpoint.stream, "offset": checkpoint.offset, "commands": checkpoint.commands}
    payload = json.dumps({**fields, "ledger": checkpoint.ledger}, sort_keys=True, separators=(",", ":")).encode()
    return f"{TOKEN_PREFIX}{_b64(payload)}.{_b64(_mac(key, payload))}"


def read_token(token: str, key: bytes | None) -> Checkpoint:
    """The checkpoint of a token made with ``key``; :class:`ResumeError` for any other text."""
    if key is None:
        raise ResumeError("resume tokens are authenticated with the pre-shared key: give a TLS mode and --key")
    text = token.strip()
    if not text.startswith(TOKEN_PREFIX) or len(text) > _MAX_TOKEN or text.count(".") != 2:
        raise ResumeError(f"not a sendstream resume token (they start with {TOKEN_PREFIX!r})")
    body, _, tag = text[len(TOKEN_PREFIX) :].partition(".")
    try:
        payload, mac = _unb64(body), _unb64(tag)
    except (binascii.Error, ValueError):
        raise ResumeError("the resume token is damaged (not base64)") from None
    if not hmac.compare_digest(mac, _mac(key, payload)):
        raise ResumeError("the resume token was not made with this key (forged, altered, or another key)")
    try:
        return _checkpoint(load_json(payload, "the resume token"))
    except SessionError as exc:  # made with the key, yet malformed: a key holder's forgery, or a bug
        raise ResumeError(f"the resume token is malformed: {exc}") from None


def _checkpoint(fields: Any) -> Checkpoint:
    """The fields of a token's payload, every one of its type."""
    if not isinstance(fields, dict) or set(fields) != _TOKEN_FIELDS:
        raise SessionError(f"it must be a JSON object of exactly {', '.join(sorted(_TOKEN_FIELDS))}")
    offset, commands, ledger = fields["offset"], fields["commands"], fields["ledger"]
    for name, value in (("offset", offset), ("commands", commands)):
        if type(value) is not int or not 0 <= value <= MAX_OFFSET:
            raise SessionError(f"{name} must be an integer from 0 to {MAX_OFFSET}")
    if not isinstance(ledger, str) or not _LEDGER.fullmatch(ledger):
        raise SessionError("ledger must be 64 lowercase hexadecimal digits (a SHA-256)")
    return Checkpoint(check_identity(fields["stream"], "stream"), offset, commands, ledger)


# --- the receiver's journal -----------------------------------------------------------------------------------------


def state_path(path: str) -> str:
    """Where a receiver writing ``path`` keeps its resume token."""
    return path + PART_SUFFIX + STATE_SUFFIX


def load_state(path: str, key: bytes | None) -> Checkpoint:
    """The checkpoint of an unfinished transfer to ``path``."""
    state = state_path(path)
    with OutputDirectory(path) as directory:
        try:
            fd = directory.open_ours(os.path.basename(state), os.O_RDONLY)
        except e.OutputError as exc:
            if directory.lstat(os.path.basename(state)) is None:
                raise ResumeError(f"nothing to resume: no {state}") from None
            raise ResumeError(f"cannot read {state}: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(_MAX_TOKEN + 1)
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ResumeError(f"{state} holds no resume token") from None
    return read_token(token, key)


def refuse_unfinished(path: str) -> None:
    """Fail when an unfinished transfer to ``path`` would be overwritten."""
    if os.path.lexists(state_path(path)):
        raise ResumeError(
            f"{state_path(path)} holds an unfinished transfer: add --resume to continue it, "
            f"or remove it and {path + PART_SUFFIX}"
        )


class Journal:
    """``path`` written in place as ``path.part``, with durable checkpoints in ``path.part.resume``.

    From ``checkpoint`` on (a resumed transfer) ``path.part`` is cut back to
    the checkpoint's offset: what came after it was never made durable. Every
    file is made or opened relative to the directory, opened once, without
    following symlinks (:class:`~sendstream.files.OutputDirectory`); an
    existing part that is not a regular file of ours is refused.
    """

    def __init__(self, path: str, key: bytes, checkpoint: Checkpoint | None = None) -> None:
        self.path = path
        self.part = path + PART_SUFFIX
        self.state = state_path(path)
        self._dir = OutputDirectory(path)
        self._part_name = os.path.basename(self.part)
        self._state_name = os.path.basename(self.state)
        self._key = key
        self.checkpoint = checkpoint
        self.token = make_token(checkpoint, key) if checkpoint else None
        self._durable = self._pending = checkpoint.offset if checkpoint else 0
        self._pending_at = time.monotonic()
        self._syncer: threading.Thread | None = None
        self._failure: BaseException | None = None
        try:
            if checkpoint is None:
                self._dir.remove_stale(self._part_name)
                self._raw = OutputFile(self._dir.create(self._part_name), self.part)
            else:
                if self._dir.lstat(self._part_name) is None:
                    raise ResumeError(f"nothing to resume: {self.part} is gone")
                self._raw = OutputFile(self._dir.open_ours(self._part_name, os.O_RDWR), self.part)
                size = os.fstat(self._raw.fileno()).st_size
                if size < checkpoint.offset:
                    self._raw.close()
                    raise ResumeError(
                        f"{self.part} has {size} bytes, fewer than the {checkpoint.offset} its resume state says"
                    )
                self._raw.truncate(checkpoint.offset)
                self._raw.fsync()
                self._raw.seek(checkpoint.offset)
        except BaseException:
            self._dir.close()
            raise
        self.file = io.BufferedWriter(self._raw, 1 << 20)

    @property
    def offset(self) -> int:
        """The last durable command boundary."""
        return self._durable

    def prefix(self) -> _Prefix:
        """The kept prefix, to be checked again against the ledger."""
        return _Prefix(os.dup(self._raw.fileno()), self._durable)

    def write(self, data: Any) -> None:
        self.file.write(data)

    def commit(self, offset: int, stream: dict[str, Any] | None, ledger: Ledger) -> int:
        """Flush; every ``CHECKPOINT_BYTES`` or seconds start making ``offset`` durable.

        The fsyncs run in a thread while the transfer goes on. Returns the
        offset that is durable now.
        """
        self.file.flush()
        if self._failure is not None:
            raise self._failure
        now = time.monotonic()
        due = offset - self._pending >= CHECKPOINT_BYTES or now - self._pending_at >= CHECKPOINT_SECONDS
        busy = self._syncer is not None and self._syncer.is_alive()
        if stream is not None and offset != self._pending and due and not busy:
            checkpoint = Checkpoint(stream, offset, ledger.commands, ledger.digest())
            self._pending, self._pending_at = offset, now
            self._syncer = threading.Thread(target=self._sync, args=(checkpoint,), daemon=True)
            self._syncer.start()
        return self._durable

    def _sync(self, checkpoint: Checkpoint) -> None:
        try:
            self._raw.fsync()  # everything before the checkpoint was flushed to the file
            token = make_token(checkpoint, self._key)
            tmp, fd = self._dir.create_temporary(0o600)
            with OutputFile(fd, self.state) as f:
                f.write((token + "\n").encode("ascii"))
                f.fsync()
            self._dir.replace(tmp, self._state_name)
            self._dir.sync()
        except (OSError, e.SendStreamError) as exc:
            self._failure = exc
            return
        self.checkpoint, self.token, self._durable = checkpoint, token, checkpoint.offset

    def _settle(self) -> None:
        if self._syncer is not None:
            self._syncer.join()

    def finish(self) -> None:
        """The whole stream is in: ``path.part`` becomes ``path``; the state goes."""
        self._settle()
        self.file.flush()
        self._raw.fsync()
        self._dir.replace(self._part_name, self._dir.name, self._raw.fileno())
        self.file.close()
        self._dir.unlink(self._state_name)
        self._dir.sync()
        self._dir.close()

    def close(self) -> None:
        """Stop (on an error): the part and the state stay for ``--resume``; a part
        with no checkpoint yet has nothing to resume from and goes."""
        self._settle()
        with contextlib.suppress(OSError):
            self.file.close()
        if self.checkpoint is None:
            self._dir.unlink(self._part_name)
        self._dir.close()


class _Prefix:
    """The first ``size`` bytes of the file ``fd`` (which it closes), as a reader."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._at = 0
        self._left = size

    def readinto(self, view: Any) -> int:
        view = memoryview(view).cast("B")[: self._left]
        if not view:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            return 0
        n = os.preadv(self._fd, [view], self._at)
        if not n:
            raise ResumeError("the kept part file shrank while it was checked again")
        self._at += n
        self._left -= n
        return n


class Chain:
    """Reads ``first`` to its end, then ``second``."""

    def __init__(self, first: Any, second: Any) -> None:
        self._first: Any = first
        self._second = second

    def readinto(self, view: Any) -> int:
        if self._first is not None:
            n: int = self._first.readinto(view)
            if n:
                return n
            self._first = None
        return int(self._second.readinto(view))
