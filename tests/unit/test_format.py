"""The construct declarations, the structs derived from them, and the CRC."""

from __future__ import annotations

import struct
import typing
import uuid
from pathlib import Path

import construct as c
import pytest
from support.streams import END, FIXTURES, decode

from sendstream import Command, Timespec, crc32c, encode_command, reference_crc32c
from sendstream.format import _layout, generate, layout
from sendstream.format import declarations as f


def test_structs_are_derived_from_the_declarations() -> None:
    assert generate.struct_of(f.StreamHeader).format == layout.STREAM_HEADER.format == "<13sL"
    assert generate.struct_of(f.CommandHeader).format == layout.COMMAND_HEADER.format == "<LHL"
    assert generate.struct_of(f.TlvHeader).format == layout.TLV_HEADER.format == "<HH"
    assert layout.STREAM_HEADER.size == f.StreamHeader.sizeof() == 17
    assert layout.COMMAND_HEADER.size == f.CommandHeader.sizeof() == 10
    assert layout.TLV_HEADER.size == f.TlvHeader.sizeof() == 4
    with pytest.raises(TypeError):
        generate.struct_of(c.Struct("x" / c.GreedyBytes))


@pytest.mark.parametrize(
    ("alias", "kind"),
    [
        ("IntAttribute", int),
        ("BytesAttribute", bytes),
        ("DataAttribute", memoryview),
        ("UuidAttribute", uuid.UUID),
        ("TimespecAttribute", Timespec),
    ],
)
def test_get_gives_every_attribute_the_type_its_overload_says(alias: str, kind: type) -> None:
    names = typing.get_args(getattr(_layout, alias))
    assert names, alias
    for name in names:
        spec = layout.ATTRIBUTES[layout.ATTRIBUTE_NUMBERS[name]]
        raw = bytes(spec.size or 3)
        assert isinstance(Command(0, [(spec.number, raw)]).get(name), kind), name
    every = {n for a in generate.TYPED_NAMES for n in typing.get_args(getattr(_layout, a))}
    assert every == {a.name for a in layout.ATTRIBUTES.values()}


def test_the_runtime_layout_is_generated_from_the_declarations() -> None:
    assert generate.LAYOUT_FILE.read_text() == generate.layout_module(), "run: python -m sendstream.format"
    assert layout.ATTRIBUTES == f.ATTRIBUTES and layout.COMMANDS == f.COMMANDS
    for name in ("MAX_ATTRIBUTE", "MAX_COMMAND", "SEND_BUF_SIZE", "STREAM_MAGIC", "MAX_VERSION"):
        assert getattr(layout, name) == getattr(f, name), name
    for kind, con in f.VALUE_KINDS.items():
        size = layout.ATTRIBUTES[next(n for n, a in f.ATTRIBUTES.items() if a.kind == kind)].size
        assert size == (None if kind in ("string", "bytes") else con.sizeof())


def test_the_c_header_is_generated_from_the_declarations() -> None:
    assert generate.HEADER_FILE.read_text() == generate.c_header(), "run: python -m sendstream.format"
    header = generate.HEADER_FILE.read_text()
    assert "#define C_END 21\n" in header and "#define A_DATA 19\n" in header
    assert "#define COMMAND_HEADER_SIZE 10\n" in header and "#define TLV_HEADER_SIZE 4\n" in header


def test_tables_follow_send_h() -> None:
    assert [f.COMMANDS[n].name for n in (1, 15, 21, 22, 23, 24, 25, 26)] == [
        "subvol",
        "write",
        "end",
        "update_extent",
        "fallocate",
        "fileattr",
        "encoded_write",
        "enable_verity",
    ]
    assert max(n for n, s in f.COMMANDS.items() if s.version == 1) == f.MAX_COMMAND[1] == 22
    assert max(n for n, s in f.COMMANDS.items() if s.version <= 2) == f.MAX_COMMAND[2] == 25
    assert max(n for n, a in f.ATTRIBUTES.items() if a.version == 1) == f.MAX_ATTRIBUTE[1] == 24
    assert max(n for n, a in f.ATTRIBUTES.items() if a.version <= 2) == f.MAX_ATTRIBUTE[2] == 31
    assert f.ATTRIBUTES[9].size == 12 and f.ATTRIBUTES[1].size == 16 and f.ATTRIBUTES[32].size == 1
    assert f.ATTRIBUTES[15].size is None


def test_end_is_the_constant_the_kernel_writes() -> None:
    assert encode_command(Command(21, []), 1) == END == bytes.fromhex("000000001500506cc99d")


def test_construct_and_the_fast_decoder_agree(stream_path: Path) -> None:
    """Every command parsed by the construct declaration equals the decoder's view."""
    data = stream_path.read_bytes()
    version = 0
    for event in decode(data):
        if event[0] == "hdr":
            version = event[2]
            parsed = f.StreamHeader.parse(data[event[1] : event[1] + 17])
            assert parsed.version == version
        elif event[0] == "cmd":
            _, offset, _, cmd, crc, attrs, _payload = event
            length = struct.unpack_from("<L", data, offset)[0]
            parsed = f.parse_with(
                f.command(version), data[offset : offset + 10 + length], offset=offset, what="a command"
            )
            assert (parsed.len, parsed.cmd, parsed.crc) == (length, cmd, crc)
            assert [(a.type, a.value) for a in parsed.attributes] == list(attrs)


def test_crc_fast_path_matches_crcmod_on_every_command(stream_path: Path) -> None:
    data = stream_path.read_bytes()
    checked = 0
    for event in decode(data):
        if event[0] != "cmd":
            continue
        offset, stored = event[1], event[4]
        length = struct.unpack_from("<L", data, offset)[0]
        raw = bytearray(data[offset : offset + 10 + length])
        raw[6:10] = b"\0\0\0\0"
        assert crc32c(raw) == reference_crc32c(bytes(raw)) == stored
        assert reference_crc32c(bytes(raw[7:]), reference_crc32c(bytes(raw[:7]))) == stored
        # chaining gives the same value as one call
        assert crc32c(raw[7:], crc32c(raw[:7])) == stored
        checked += 1
    assert checked > 2


def test_the_standard_crc32c_is_not_the_btrfs_one() -> None:
    import crc32c as hw

    from sendstream.codec.backend import pure

    package_crc = pure().crc32c
    assert hw.crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"123456789") != 0xE3069283
    assert crc32c(b"123456789") == reference_crc32c(b"123456789") == package_crc(b"123456789")
    data = (FIXTURES / "rich-full-v2.stream").read_bytes()
    assert package_crc(data[100:], package_crc(data[:100])) == crc32c(data) == reference_crc32c(data)


def test_typed_values_and_build() -> None:
    u = uuid.UUID("cd9bea4b-3404-de43-8430-8cb55767575c")
    cmd = Command.build(
        "utimes",
        [("path", b"a\xffb"), ("atime", Timespec(-5, 7)), ("mtime", Timespec(1, 2)), ("ctime", Timespec(3, 4))],
    )
    assert cmd.get("atime") == Timespec(-5, 7)
    assert cmd.get("path") == b"a\xffb"
    snap = Command.build("subvol", {"path": b"s", "uuid": u, "ctransid": 9})
    assert snap.get("uuid") == u and snap.get("ctransid") == 9
    assert snap.values() == {"path": b"s", "uuid": u, "ctransid": 9}
    assert snap.get("ino", None) is None
    with pytest.raises(KeyError):
        snap.get("ino")


def test_construct_errors_become_ours() -> None:
    from sendstream.errors import FormatError

    with pytest.raises(FormatError) as info:
        f.parse_with(f.StreamHeader, b"not-a-header-at-all", offset=5, what="a stream header")
    assert info.value.offset == 5 and info.value.expected == "a stream header"


def test_the_docs_table_of_commands_is_generated_from_the_declarations() -> None:
    text = generate.TABLE_FILE.read_text()
    assert generate.page_with_table(text) == text, "run: python -m sendstream.format"
    table = generate.attribute_table()
    assert "| `write` | 15 | 1 | `path`: bytes, `file_offset`: int, `data`: memoryview |" in table
    assert table.count("\n") == 2 + 26  # every command
