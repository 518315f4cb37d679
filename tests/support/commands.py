"""Commands built by name with typed attributes, for streams a test crafts."""

from __future__ import annotations

import uuid

from sendstream import Command, encode_command

SUBVOL_UUID = uuid.UUID(int=1)


def build(name: str, *attrs: tuple[str, object]) -> Command:
    return Command.build(name, list(attrs))


def encoded(name: str, *attrs: tuple[str, object]) -> bytes:
    return encode_command(build(name, *attrs), 2)


def subvol(path: bytes = b"s") -> Command:
    return build("subvol", ("path", path), ("uuid", SUBVOL_UUID), ("ctransid", 1))


def snapshot(path: bytes = b"s") -> Command:
    return build(
        "snapshot",
        ("path", path),
        ("uuid", SUBVOL_UUID),
        ("ctransid", 2),
        ("clone_uuid", uuid.UUID(int=2)),
        ("clone_ctransid", 1),
    )
