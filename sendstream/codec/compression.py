"""Decompression of ENCODED_WRITE data: zlib, zstd and btrfs' LZO format.

:func:`decompress` turns the DATA of an ENCODED_WRITE (as ``btrfs send
--compressed-data`` sends it) into its ``unencoded_len`` plain bytes, like
btrfs-progs does: a shorter output is padded with zeros, a longer one is
cut. Output is bounded by ``unencoded_len`` whatever the input claims, so a
crafted extent cannot make more than that exist at once (zstd input is fed
in small pieces; LZO segments are bounded by a sector each).

LZO: btrfs' own extent format (fs/btrfs/lzo.c: a le32 total length, then
segments of at most one sector, each a le32 length and LZO1X data, whose
header never crosses a sector boundary) around an LZO1X decoder written
here (:func:`lzo1x_decompress`, as ``lzo1x_decompress_safe``), so no C
library is needed. zstd needs the ``zstandard`` package.
"""

from __future__ import annotations

import struct
import zlib

__all__ = [
    "COMPRESSION_LZO_4K",
    "COMPRESSION_LZO_64K",
    "COMPRESSION_NONE",
    "COMPRESSION_ZLIB",
    "COMPRESSION_ZSTD",
    "MAX_UNENCODED",
    "compression_name",
    "decompress",
    "lzo1x_decompress",
]

# The largest unencoded extent btrfs writes (BTRFS_MAX_UNCOMPRESSED): the
# default limit on what one ENCODED_WRITE may decompress to.
MAX_UNENCODED = 128 * 1024

COMPRESSION_NONE = 0
COMPRESSION_ZLIB = 1
COMPRESSION_ZSTD = 2
COMPRESSION_LZO_4K = 3
COMPRESSION_LZO_64K = 7


def compression_name(compression: int) -> str:
    """``none``, ``zlib``, ``zstd``, ``lzo-4k`` ... ``lzo-64k``, or ``unknown(N)``."""
    if compression == COMPRESSION_NONE:
        return "none"
    if compression == COMPRESSION_ZLIB:
        return "zlib"
    if compression == COMPRESSION_ZSTD:
        return "zstd"
    if COMPRESSION_LZO_4K <= compression <= COMPRESSION_LZO_64K:
        return f"lzo-{4 << (compression - COMPRESSION_LZO_4K)}k"
    return f"unknown({compression})"


class _LzoError(ValueError):
    pass


def lzo1x_decompress(src: bytes | memoryview, limit: int) -> bytes:
    """Decompress one LZO1X block (as ``lzo1x_decompress_safe``), at most ``limit`` bytes out.

    Raises ValueError on any malformed input: overruns of input, output
    or look-behind, or input left after the end marker.
    """
    data = bytes(src)
    n = len(data)
    out = bytearray()
    ip = 0

    def byte() -> int:
        nonlocal ip
        if ip >= n:
            raise _LzoError("input overrun")
        b = data[ip]
        ip += 1
        return b

    def run_length(base: int) -> int:
        # A zero length field: each zero byte adds 255, then the next byte.
        nonlocal ip
        start = ip
        while ip < n and data[ip] == 0:
            ip += 1
        if ip >= n:
            raise _LzoError("input overrun")
        zeros = ip - start
        ip += 1
        return base + 255 * zeros + data[ip - 1]

    def literals(count: int) -> None:
        nonlocal ip
        if ip + count > n:
            raise _LzoError("input overrun")
        if len(out) + count > limit:
            raise _LzoError("output overrun")
        out.extend(data[ip : ip + count])
        ip += count

    def match(distance: int, length: int) -> None:
        start = len(out) - distance
        if start < 0:
            raise _LzoError("look-behind overrun")
        if len(out) + length > limit:
            raise _LzoError("output overrun")
        if distance >= length:
            out.extend(out[start : start + length])
        else:  # overlapping: the pattern repeats
            pattern = out[start:]
            out.extend((pattern * (length // distance + 1))[:length])

    if n < 3:
        raise _LzoError("input overrun")
    state = 0  # literals copied right before: 0, 1-3 (after a match), 4 (after a literal run)
    t = data[0]
    if t > 17:
        ip = 1
        count = t - 17
        literals(count)
        state = count if count < 4 else 4
    while True:
        t = byte()
        if t < 16:
            if state == 0:
                literals(run_length(15) + 3 if t == 0 else t + 3)
                state = 4
                continue
            trailing = t & 3
            if state != 4:
                match(1 + (t >> 2) + (byte() << 2), 2)
            else:
                match(1 + 0x800 + (t >> 2) + (byte() << 2), 3)
        elif t >= 64:
            trailing = t & 3
            match(1 + ((t >> 2) & 7) + (byte() << 3), (t >> 5) + 1)
        elif t >= 32:
            length = t & 31
            length = run_length(31) + 2 if length == 0 else length + 2
            d = byte() | byte() << 8
            trailing = d & 3
            match(1 + (d >> 2), length)
        else:
            length = t & 7
            length = run_length(7) + 2 if length == 0 else length + 2
            d = byte() | byte() << 8
            trailing = d & 3
            distance = ((t & 8) << 11) + (d >> 2)
            if distance == 0:  # the end marker
                if length != 3:
                    raise _LzoError("bad end marker")
                if ip != n:
                    raise _LzoError(f"{n - ip} bytes of input after the end marker")
                return bytes(out)
            match(distance + 0x4000, length)
        literals(trailing)
        state = trailing


def _lzo_btrfs(data: bytes | memoryview, unencoded_len: int, sector: int) -> bytes:
    """btrfs' LZO extent format (fs/btrfs/lzo.c): le32 total length, then
    segments of at most one sector each, each a le32 length and LZO1X data;
    a segment header never crosses a sector boundary (up to 3 zero bytes pad)."""
    mv = memoryview(data)
    if len(mv) < 4:
        raise _LzoError("lzo header is truncated")
    total = struct.unpack_from("<I", mv, 0)[0]
    if total > len(mv):
        raise _LzoError(f"lzo header says {total} bytes, the data has {len(mv)}")
    out = bytearray()
    pos = 4
    while pos < total and len(out) < unencoded_len:
        left_in_sector = -pos % sector
        if left_in_sector < 4:
            if total - pos <= left_in_sector:
                break
            pos += left_in_sector
        if total - pos < 4:
            raise _LzoError("lzo segment header is truncated")
        seg = struct.unpack_from("<I", mv, pos)[0]
        pos += 4
        if seg > total - pos:
            raise _LzoError("lzo segment runs past the extent")
        out += lzo1x_decompress(mv[pos : pos + seg], sector)  # as btrfs-progs: up to a sector each
        pos += seg
    return bytes(out)


def decompress(compression: int, data: bytes | memoryview, unencoded_len: int) -> bytes:
    """The ``unencoded_len`` bytes of an ENCODED_WRITE's data.

    Like btrfs-progs, a shorter output is padded with zeros. Raises
    ValueError for bad data or an unknown compression, and ImportError when
    zstd data needs the missing ``zstandard`` package.
    """
    if compression == COMPRESSION_NONE:
        out = bytes(data[:unencoded_len])
    elif compression == COMPRESSION_ZLIB:
        try:
            inflater = zlib.decompressobj()
            out = inflater.decompress(data, unencoded_len)
        except zlib.error as exc:
            raise ValueError(f"zlib: {exc}") from None
    elif compression == COMPRESSION_ZSTD:
        out = _zstd(data, unencoded_len)
    elif COMPRESSION_LZO_4K <= compression <= COMPRESSION_LZO_64K:
        out = _lzo_btrfs(data, unencoded_len, 1 << (compression - COMPRESSION_LZO_4K + 12))
    else:
        raise ValueError(f"unknown compression {compression}")
    return out + bytes(unencoded_len - len(out)) if len(out) < unencoded_len else out[:unencoded_len]


def _zstd(data: bytes | memoryview, limit: int) -> bytes:
    """One zstd frame (btrfs pads it to the sector), at most ``limit`` bytes out.

    The input goes in small pieces so that a crafted frame cannot make much
    more than ``limit`` bytes exist at once.
    """
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ImportError("zstd-compressed data needs the zstandard package (pip install zstandard)") from exc
    inflater = zstandard.ZstdDecompressor().decompressobj()
    mv = memoryview(data)
    out = bytearray()
    try:
        for pos in range(0, len(mv), _ZSTD_PIECE):
            out += inflater.decompress(mv[pos : pos + _ZSTD_PIECE])
            if inflater.eof or len(out) >= limit:
                break
    except zstandard.ZstdError as exc:
        raise ValueError(f"zstd: {exc}") from None
    return bytes(out[:limit])


_ZSTD_PIECE = 256
