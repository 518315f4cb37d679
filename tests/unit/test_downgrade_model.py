"""The downgrade in process: the fixtures converted to valid v1, the same as the kernel's v1, the same
bytes; the sans-I/O converter's edge cases and bounds. Its command line is
tests/integration/test_downgrade_cli.py; real btrfs receive of the result tests/system/test_downgrade.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.downgrading import V2_STREAMS, fallocate, to_v1
from support.streams import FIXTURES

from sendstream import Command, StreamHeader
from sendstream.codec.backend import Backend
from sendstream.codec.framer import Framer
from sendstream.errors import DowngradeError, LimitExceeded
from sendstream.format.declarations import COMMANDS
from sendstream.io.windows import file_events
from sendstream.ops.downgrade import V1_WRITE_SIZE, Downgrader
from sendstream.ops.verify import verify_file
from sendstream.render.dump import TextDumper


def dump_lines(path: Path, backend: Backend) -> list[bytes]:
    dumper = TextDumper()
    with path.open("rb") as f:
        return [dumper.line(ev) for ev in file_events(f, Framer(backend=backend)) if isinstance(ev, Command)]


@pytest.mark.parametrize("name", [*V2_STREAMS, "verity-v3"])
def test_result_is_a_valid_v1_stream(name: str, tmp_path: Path, backend: Backend) -> None:
    out = tmp_path / "v1.stream"
    warnings = to_v1(FIXTURES / f"{name}.stream", out, backend)
    with out.open("rb") as f:
        report = verify_file(f, backend=backend)
    assert report.ok, report.problems
    with out.open("rb") as f:
        events = list(file_events(f, Framer(backend=backend)))
    assert [ev.version for ev in events if isinstance(ev, StreamHeader)] == [1]
    for ev in events:
        if isinstance(ev, Command):
            assert COMMANDS[ev.cmd].version == 1, ev.name
            if ev.name == "write":
                assert len(ev.get("data")) <= V1_WRITE_SIZE
    dropped = {w.split("(")[1].split(")")[0] for w in warnings}
    assert dropped == {"rich-incr-v2": {"fileattr"}, "verity-v3": {"fileattr", "enable_verity"}}.get(name, set())


def test_incremental_equals_the_kernels_v1(tmp_path: Path, backend: Backend) -> None:
    """The kernel's v1 and v2 incrementals are of the same snapshots: converted, v2 gives v1's dump,
    the punched hole (FALLOCATE) included as a WRITE of zeros."""
    out = tmp_path / "incr-as-v1.stream"
    to_v1(FIXTURES / "rich-incr-v2.stream", out, backend)
    assert dump_lines(out, backend) == dump_lines(FIXTURES / "rich-incr-v1.stream", backend)
    with out.open("rb") as f:
        zeros = [
            ev
            for ev in file_events(f, Framer(backend=backend))
            if isinstance(ev, Command) and ev.name == "write" and not any(ev.get("data"))
        ]
    assert [(bytes(ev.get("path")), ev.get("file_offset"), len(ev.get("data"))) for ev in zeros] == [
        (b"random-reflink.bin", 131072, 32768)
    ]


def file_data(path: Path, backend: Backend) -> dict[bytes, bytes]:
    """The image of every file the stream writes (WRITE and decompressed ENCODED_WRITE), by path."""
    files: dict[bytes, bytearray] = {}
    from sendstream.codec.compression import decompress

    with path.open("rb") as f:
        for ev in file_events(f, Framer(backend=backend)):
            if not isinstance(ev, Command) or ev.name not in ("write", "encoded_write"):
                continue
            p = bytes(ev.get("path"))
            off = int(ev.get("file_offset"))
            if ev.name == "write":
                data = bytes(ev.get("data"))
            else:
                plain = decompress(int(ev.get("compression")), ev.get("data"), int(ev.get("unencoded_len")))
                start = int(ev.get("unencoded_offset"))
                data = plain[start : start + int(ev.get("unencoded_file_len"))]
            buf = files.setdefault(p, bytearray())
            if len(buf) < off + len(data):
                buf.extend(bytes(off + len(data) - len(buf)))
            buf[off : off + len(data)] = data
    return {p: bytes(b) for p, b in files.items()}


def test_encoded_writes_become_the_same_bytes(tmp_path: Path, backend: Backend) -> None:
    out = tmp_path / "v1.stream"
    to_v1(FIXTURES / "compressed-v2.stream", out, backend)
    assert file_data(out, backend) == file_data(FIXTURES / "compressed-v2.stream", backend)


def test_sans_io_and_edge_cases() -> None:
    d = Downgrader()
    assert d.send(StreamHeader(0, 2)) == [StreamHeader(0, 1)]
    assert d.send(Command.build("mkfile", [("path", b"f"), ("ino", 257)]))[0].name == "mkfile"
    big = bytes(range(256)) * 512  # 128 KiB
    writes = d.send(Command.build("write", [("path", b"f"), ("file_offset", 10), ("data", big)]))
    assert [(w.get("file_offset"), len(w.get("data"))) for w in writes] == [(10, 49152), (49162, 49152), (98314, 32768)]
    assert b"".join(bytes(w.get("data")) for w in writes) == big
    # punch inside a file of known size: zeros, cut at the size (KEEP_SIZE)
    zeros = d.send(
        Command.build("fallocate", [("path", b"f"), ("fallocate_mode", 3), ("file_offset", 131000), ("size", 4096)])
    )
    assert [(w.name, w.get("file_offset"), len(w.get("data"))) for w in zeros] == [("write", 131000, 82)]
    assert (
        d.send(Command.build("fallocate", [("path", b"f"), ("fallocate_mode", 1), ("file_offset", 0), ("size", 9)]))
        == []
    )
    grow = d.send(
        Command.build("fallocate", [("path", b"f"), ("fallocate_mode", 0), ("file_offset", 0), ("size", 200000)])
    )
    assert [(c.name, c.get("size")) for c in grow] == [("truncate", 200000)]
    assert (
        d.send(Command.build("fallocate", [("path", b"g"), ("fallocate_mode", 0), ("file_offset", 0), ("size", 9)]))
        == []
    )
    assert "unknown size" in d.warnings[-1]
    enc = Command.build(
        "encoded_write",
        [("path", b"f"), ("file_offset", 0), ("unencoded_file_len", 4), ("unencoded_len", 4),
         ("unencoded_offset", 0), ("compression", 0), ("encryption", 1), ("data", b"abcd")],
    )  # fmt: skip
    with pytest.raises(DowngradeError, match="encrypted"):
        d.send(enc)
    v1 = Downgrader()
    assert v1.send(StreamHeader(0, 1)) == [StreamHeader(0, 1)]
    cmd = Command.build("write", [("path", b"f"), ("file_offset", 0), ("data", b"x")])
    assert v1.send(cmd) == [cmd]


# --- bounded: zeros for holes, sizes through renames, offsets ----------------------


def test_zeros_count_over_the_run_and_stop_at_known_sizes() -> None:
    d = Downgrader(max_zero_fill=100_000, parent={b"other": 1 << 40}.get)
    d.send(StreamHeader(0, 2))
    d.send(Command.build("mkfile", [("path", b"f"), ("ino", 257)]))
    d.send(Command.build("truncate", [("path", b"f"), ("size", 70_000)]))
    # KEEP_SIZE: cut at the size the stream shows, only 70,000 - 10 bytes count
    cut = d.send(fallocate(b"f", 3, 10, 1 << 40))
    assert sum(len(w.get("data")) for w in cut) == 69_990 == d.zero_fill
    assert sum(len(w.get("data")) for w in d.send(fallocate(b"other", 3, 0, 30_010))) == 30_010
    with pytest.raises(LimitExceeded):
        d.send(fallocate(b"other", 3, 0, 1))
    # the size follows the file through a rename of its directory
    e = Downgrader()
    e.send(StreamHeader(0, 2))
    e.send(Command.build("mkfile", [("path", b"d/f"), ("ino", 258)]))
    e.send(Command.build("truncate", [("path", b"d/f"), ("size", 100)]))
    e.send(Command.build("rename", [("path", b"d"), ("path_to", b"e")]))
    assert [len(w.get("data")) for w in e.send(fallocate(b"e/f", 3, 0, 1 << 30))] == [100]
    # and through a hard link: one inode, one size
    e.send(Command.build("link", [("path", b"g"), ("path_link", b"e/f")]))
    assert [len(w.get("data")) for w in e.send(fallocate(b"g", 3, 50, 1 << 30))] == [50]


def test_ranges_past_the_largest_offset_are_errors_not_crashes() -> None:
    """Writes split or zeros written past 2^64 used to die in struct.pack."""
    top = (1 << 64) - 10
    for command in (
        Command.build("write", [("path", b"f"), ("file_offset", top), ("data", bytes(V1_WRITE_SIZE + 1))]),
        fallocate(b"f", 3, top, 100),
        fallocate(b"f", 0, top, 100),
    ):
        d = Downgrader()
        d.send(StreamHeader(0, 2))
        d.send(Command.build("mkfile", [("path", b"f"), ("ino", 257)]))
        with pytest.raises(DowngradeError, match="past the largest file offset"):
            d.send(command)


def test_preallocation_to_2_64_is_an_error_not_a_crash() -> None:
    """A range may end at 2^64 (its last byte at 2^64 - 1), but a FALLOCATE that grows the
    file there became a TRUNCATE to 2^64, which died in struct.pack (fuzz corpus
    convert/crash-fallocate-grows-file-to-2-64); a WRITE that ends there still converts."""
    d = Downgrader()
    d.send(StreamHeader(0, 2))
    d.send(Command.build("mkfile", [("path", b"f"), ("ino", 257)]))
    with pytest.raises(DowngradeError, match="past the largest file size") as caught:
        d.send(fallocate(b"f", 0, 1 << 63, 1 << 63))
    assert caught.value.expected == f"a size at most {(1 << 64) - 1}"
    write = Command.build("write", [("path", b"f"), ("file_offset", (1 << 64) - 10), ("data", bytes(10))])
    assert [c.get("file_offset") for c in d.send(write)] == [(1 << 64) - 10]


def test_renames_cost_the_same_whatever_the_number_of_files() -> None:
    """Every RENAME scanned every known size (40k files and 40k renames: 32 s); now the sizes live on
    the inodes of a PathTracker and a rename moves one name: time grows with n, not n^2."""

    def convert(n: int) -> float:
        commands = [Command.build("mkdir", [("path", b"d0"), ("ino", 256)])]
        commands += [Command.build("mkfile", [("path", b"d0/f%06d" % i), ("ino", 300 + i)]) for i in range(n)]
        commands += [Command.build("rename", [("path", b"d%d" % i), ("path_to", b"d%d" % (i + 1))]) for i in range(n)]
        commands.append(fallocate(b"d%d/f000000" % n, 3, 0, 1 << 20))
        best = float("inf")
        for _ in range(3):
            d = Downgrader()
            d.send(StreamHeader(0, 2))
            start = time.process_time()  # this process's CPU: other processes' load does not count
            for c in commands[:-1]:
                d.send(c)
            best = min(best, time.process_time() - start)
            assert d.send(commands[-1]) == []  # the file's size, 0, went along with its directory
        return best

    small, large = convert(10_000), convert(40_000)
    assert large < 8 * small, (small, large)  # linear: ~4x; scanning every size per rename: ~16x
