"""Pre-shared keys: read from a key file, derived from a password, named by an identity, looked up by the server."""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Callable
from typing import Final

from ...errors import HandshakeError, KeyFileError, KeyFileUnreadable, TlsCause, UsageError
from ...io.outputs import OutputDirectory, OutputFile

MAX_IDENTITY: Final = 128  # bytes of UTF-8; OpenSSL and GnuTLS accept at least this much
SALT_PREFIX: Final = b"sendstream-psk:"

_MAX_KEY_FILE = 64 << 10
_HEX = re.compile(rb"[0-9A-Fa-f]+")
_BASE64 = re.compile(rb"[A-Za-z0-9+/]+={0,2}")
_PEM = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)-----END \1-----", re.DOTALL)


def load_key(path: str | os.PathLike[str], warn: Callable[[str], object] | None = None) -> bytes:
    """The pre-shared key in ``path``: a PEM block's base64 body, else the file's bytes exactly.

    Raw bytes are used as stored, with no newline stripped: a key is binary,
    and a random key ends in ``\\n`` once in 256 times (keys deployed that
    way keep working). A raw file that looks like text (base64, hex, a
    trailing newline) is passed to ``warn``: which bytes are used, and the
    fingerprint. Like ssh with private keys, a file that group or others may
    access in any way is refused.
    """
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if mode & 0o077:
                raise KeyFileError(
                    f"key file {os.fspath(path)!r} is accessible by group or others (mode {mode & 0o777:04o}); "
                    f"run: chmod 600 {os.fspath(path)}"
                )
            data = f.read(_MAX_KEY_FILE + 1)
    except OSError as exc:
        raise KeyFileUnreadable(f"cannot read key file {os.fspath(path)!r}: {exc.strerror}") from exc
    if len(data) > _MAX_KEY_FILE:
        raise KeyFileError(f"key file {os.fspath(path)!r} is larger than {_MAX_KEY_FILE} bytes: not a key")
    pem = _PEM.search(data)
    if pem:
        try:
            data = base64.b64decode(b"".join(pem.group(2).split()), validate=True)
        except binascii.Error as exc:
            raise KeyFileError(f"key file {os.fspath(path)!r}: bad base64 in the PEM block ({exc})") from exc
    if not data:
        raise KeyFileError(f"key file {os.fspath(path)!r} holds no key")
    if not pem and warn is not None:
        trap = text_key_trap(data)
        if trap:
            warn(
                f"key file {os.fspath(path)!r} has no PEM armour, so its {len(data)} bytes are the key "
                f"exactly as stored ({trap}); fingerprint {fingerprint(data)}. The other end must use the same "
                f"bytes; `sendstream key new FILE` writes a key without this trap (docs: Move streams, Keys)"
            )
    return data


def text_key_trap(data: bytes) -> str | None:
    """What makes raw key bytes a trap (they look like text that means other bytes), or None."""
    if not all(32 <= b < 127 or b in b"\t\r\n" for b in data):
        return None  # binary: used as it is, as meant
    body = data.strip()
    newline = " and the trailing newline is part of it" if data.endswith(b"\n") else ""
    if _HEX.fullmatch(body) and len(body) % 2 == 0:
        return f"they look like hex: the text is the key, not the {len(body) // 2} bytes it spells{newline}"
    if _BASE64.fullmatch(body) and len(body) % 4 == 0:
        return f"they look like base64: the text is the key, not the bytes it decodes to{newline}"
    return f"it is text{newline}" if newline else None


def fingerprint(key: bytes) -> str:
    """A short name of ``key`` to compare between hosts: ``sha256:`` and the first 16 hex
    digits of its SHA-256 (for a raw key file, what ``sha256sum FILE`` starts with)."""
    import hashlib

    return "sha256:" + hashlib.sha256(key).hexdigest()[:16]


PEM_LABEL: Final = "SENDSTREAM PSK"
NEW_KEY_BYTES: Final = 32


def new_key_file(path: str) -> bytes:
    """Write a new random key to ``path`` (which must not exist) as a PEM block, mode 0600; return the key.

    Made as every output is (:class:`~sendstream.io.outputs.OutputDirectory`): never through a
    planted symlink, and a file that is there is never written over.
    """
    key = os.urandom(NEW_KEY_BYTES)
    text = f"-----BEGIN {PEM_LABEL}-----\n{base64.b64encode(key).decode()}\n-----END {PEM_LABEL}-----\n"
    with OutputDirectory(path) as directory:
        if directory.lstat(directory.name) is not None:
            raise UsageError(f"{path!r} exists: a key file is never overwritten")
        fd = directory.create(directory.name, 0o600)
        try:
            with OutputFile(fd, path) as out:
                out.write(text.encode())
                out.fsync()
        except BaseException:
            directory.unlink(directory.name)
            raise
    return key


def derive_key(password: str, salt: bytes | str) -> bytes:
    """A 32-byte pre-shared key from a password: scrypt with n=2**15, r=8, p=1.

    Both ends must use the same salt. A ``str`` is taken as the PSK identity
    and turned into the salt ``b"sendstream-psk:" + identity.encode()``, which
    is what sendstream uses; ``bytes`` are used as given.
    """
    import hashlib  # here: the CLI loads this package at start-up, which hashlib would make a tenth slower

    if not password:
        raise UsageError("empty password")
    if isinstance(salt, str):
        salt = SALT_PREFIX + salt.encode("utf-8")
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=1 << 15, r=8, p=1, maxmem=64 << 20, dklen=32)


def encode_identity(identity: str) -> bytes:
    """The PSK identity as the client sends it: 1 to :data:`MAX_IDENTITY` bytes of UTF-8 without NUL."""
    raw = identity.encode("utf-8")
    if not 0 < len(raw) <= MAX_IDENTITY or b"\0" in raw:
        raise UsageError(f"the PSK identity must be 1 to {MAX_IDENTITY} bytes of UTF-8 without NUL: {identity!r}")
    return raw


class ServerKeys:
    """The server's key lookup during one handshake, called from the TLS library's callback."""

    def __init__(self, keys: Callable[[str], bytes | None] | bytes) -> None:
        self.keys = keys
        self.unknown: str | None = None
        self.error: BaseException | None = None
        self.found: tuple[str, bytes] | None = None  # the identity and key the client was checked against

    def find(self, raw_identity: bytes) -> bytes | None:
        """The key for ``raw_identity``; None for an unknown identity (kept in ``unknown``) or a failed lookup."""
        try:
            identity = raw_identity.decode("utf-8", "backslashreplace")
            key = self.keys(identity) if callable(self.keys) else self.keys
        except BaseException as exc:  # raised again after the handshake, not inside the TLS library
            self.error = exc
            return None
        if not key:
            self.unknown = identity
            return None
        self.found = (identity, key)
        return key

    def lookup_failure(self) -> BaseException | None:
        """After a failed handshake, what the lookup knows better: its own error, or the unknown identity."""
        if self.error is not None:
            return self.error
        if self.unknown is not None:
            return HandshakeError(f"TLS handshake failed: unknown PSK identity {self.unknown!r}", TlsCause.KEY)
        return None
