"""The example scripts of examples/ (shown in the README) run on fixtures and say the truth."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.streams import FIXTURES, ROOT

from sendstream.extract import extract_stream as extract
from sendstream.render.dump import escape

EXAMPLES = ROOT / "examples"


def run(script: str, stream: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), str(FIXTURES / f"{stream}.stream")],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.splitlines()


def shown(path: bytes) -> str:
    return escape(path).decode("utf-8", "replace")


@pytest.mark.parametrize("stream", ["rich-full-v1", "compressed-v2", "rich-full-v2"])
def test_files_written_gives_final_paths_and_sizes(stream: str, tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    with (FIXTURES / f"{stream}.stream").open("rb") as f:
        extract(f, tmp_path / "t")
    lines = run("files_written.py", stream)
    assert len(lines) > 5
    on_disk = {}
    for dirpath, _, files in os.walk(os.fsencode(tmp_path / "t")):
        for name in files:
            p = os.path.join(dirpath, name)
            on_disk[shown(os.path.relpath(p, os.fsencode(tmp_path / "t")))] = os.lstat(p).st_size
    for line in lines:
        size, path = line.split(None, 1)
        assert on_disk[path] == int(size), line


def test_binary_xattrs_finds_every_binary_value(tmp_path: Path) -> None:
    root = tmp_path / "t"
    root.mkdir()
    with (FIXTURES / "rich-full-v1.stream").open("rb") as f:
        extract(f, root)
    expected = set()
    for dirpath, dirs, files in os.walk(os.fsencode(root)):
        for name in [*dirs, *files]:
            p = os.path.join(dirpath, name)
            for x in os.listxattr(p, follow_symlinks=False):
                value = os.getxattr(p, x, follow_symlinks=False)
                try:
                    binary = not all(c.isprintable() or c in "\t\n" for c in value.decode())
                except UnicodeDecodeError:
                    binary = True
                if binary:
                    expected.add((shown(os.path.relpath(p, os.fsencode(root))), shown(os.fsencode(x)), len(value)))
    lines = run("binary_xattrs.py", "rich-full-v1")
    got = {(f[0], f[1], int(f[2].split()[0])) for f in (line.split("  ") for line in lines)}
    assert got == expected
    assert ("hello.txt", "security.capability", 20) in got


def test_top_files_table_and_ranking() -> None:
    lines = run("top_files.py", "rich-full-v1")
    assert lines[0].startswith("stream 1 at offset 0, version 1: subvol rich_base uuid=")
    total = next(line for line in lines if line.strip().startswith("total")).split()
    assert total[1] == "508"  # MANIFEST.md's counts for rich-full-v1
    top = lines[lines.index("top 10 files by bytes written:") + 1 :]
    assert len(top) == 10
    sizes = [int(line.split()[0]) for line in top]
    assert sizes == sorted(sizes, reverse=True)
    assert top[0].split()[1] in ("random.bin", "random-reflink.bin") and sizes[0] == 204800
