"""The dump prints a time the same on both codec backends, at and around every limit: the native
printer formats with localtime_r and strftime, as btrfs-progs does; the pure one did with
time.strftime, which refused the years past 2^31 - 1 that localtime_r still gives
(``cannot print the command: OverflowError`` where the native path and progs print)."""

from __future__ import annotations

import io

import pytest
from support.streams import EDGE_TIMES, crafted
from support.zones import zone

from sendstream import Command, encode_command
from sendstream.codec.backend import Backend, native, pure
from sendstream.errors import SendStreamError
from sendstream.format.specs import Timespec
from sendstream.render.dump import dump

ZONES = ("UTC", "Europe/Amsterdam", "America/Sao_Paulo")  # +00:19:32 and -03:06:28 before their first rule


def utimes_stream(sec: int) -> bytes:
    times = [("atime", Timespec(sec, 0)), ("mtime", Timespec(0, 0)), ("ctime", Timespec(sec, 999_999_999))]
    return crafted(1, encode_command(Command.build("utimes", [("path", b"f"), *times]), 1))


def dumped(data: bytes, backend: Backend) -> tuple[str, bytes | str]:
    out = io.BytesIO()
    try:
        dump(io.BytesIO(data), out, backend=backend)
    except SendStreamError as exc:
        return "error", str(exc)
    return "text", out.getvalue()


@pytest.mark.parametrize("name", ZONES)
def test_both_backends_print_every_edge_time_alike(name: str) -> None:
    built = native()
    if built is None:
        pytest.skip("the native module is not built")
    with zone(name):
        results = {sec: dumped(utimes_stream(sec), pure()) for sec in EDGE_TIMES}
        for sec, result in results.items():
            assert dumped(utimes_stream(sec), built) == result, sec
    if name != "UTC":
        return
    # in UTC, what localtime_r represents prints, from the first second of the year INT_MIN + 1900 to
    # the last of INT_MAX + 1900; past them both stop with the time named, as btrfs-progs does
    printable = {sec for sec, (kind, _) in results.items() if kind == "text"}
    assert {67_768_036_191_676_799, -67_768_040_609_740_800, 253_402_300_800, -62_135_596_801} <= printable
    assert not {67_768_036_191_676_800, -67_768_040_609_740_801, (1 << 63) - 1, -(1 << 63)} & printable
    assert results[67_768_036_191_676_800][0] == "error"
    message = results[67_768_036_191_676_800][1]
    assert "67768036191676800" in str(message) and "OverflowError" not in str(message)


def test_the_last_time_of_struct_tm_in_utc_on_the_pure_path() -> None:
    """The campaign's atime: the year is printed as the C library prints it (glibc 2.36 wraps
    2147485547 to -2147481749, as btrfs-progs 6.2 shows it), the rest as ever."""
    with zone("UTC"):
        kind, text = dumped(utimes_stream(67_768_036_191_676_799), pure())
    assert kind == "text" and b"-12-31T23:59:59+0000 mtime=1970-01-01T00:00:00+0000" in text
