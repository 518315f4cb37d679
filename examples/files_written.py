"""Every regular file a stream writes data to: its final path and size.

Usage: python3 files_written.py STREAM

The path is where the file is when the stream ends (after btrfs' temporary
names and any later rename); the size is the largest end of what the stream
wrote (WRITE, ENCODED_WRITE, CLONE), or the last TRUNCATE after it.
"""

import sys

from sendstream import Command
from sendstream.analysis.paths import PathTracker
from sendstream.io.windows import file_events
from sendstream.render.dump import escape

tracker = PathTracker()
files = {}  # id(inode) -> [entry, size]
with open(sys.argv[1], "rb") as stream:
    for event in file_events(stream):
        if not isinstance(event, Command):
            continue
        touched = tracker.feed(event)
        if touched is None:
            continue
        if event.name == "write":
            end = event.get("file_offset") + len(event.get("data"))
        elif event.name == "encoded_write":
            end = event.get("file_offset") + event.get("unencoded_file_len")
        elif event.name == "clone":
            end = event.get("file_offset") + event.get("clone_len")
        elif event.name == "truncate" and id(touched.entry.inode) in files:
            files[id(touched.entry.inode)][1] = event.get("size")
            continue
        else:
            continue
        record = files.setdefault(id(touched.entry.inode), [touched.entry, 0])
        record[1] = max(record[1], end)

for entry, size in sorted(files.values(), key=lambda r: r[0].final_path() or b""):
    path = entry.final_path()
    name = escape(path).decode("utf-8", "replace") if path is not None else "(deleted)"
    print(f"{size:>12}  {name}")
