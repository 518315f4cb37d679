"""Stream statistics and the 10 files that receive the most data.

Usage: python3 top_files.py STREAM

First the per-command table (count, bytes on the wire, data bytes, file
bytes), then the files ranked by the file bytes written to them (WRITE,
ENCODED_WRITE once decompressed, CLONE), under their final paths.
"""

import sys
from collections import Counter

from sendstream import Command
from sendstream.analysis.paths import PathTracker
from sendstream.analysis.statistics import Statistics
from sendstream.io.windows import file_events
from sendstream.render.dump import escape
from sendstream.render.paths import statistics_lines

statistics = Statistics()
tracker = PathTracker()
written = Counter()  # id(entry) -> bytes
entries = {}
with open(sys.argv[1], "rb") as stream:
    for event in file_events(stream):
        statistics.feed(event)
        if not isinstance(event, Command):
            continue
        touched = tracker.feed(event)
        if touched is None:
            continue
        if event.name == "write":
            n = len(event.get("data"))
        elif event.name == "encoded_write":
            n = event.get("unencoded_file_len")
        elif event.name == "clone":
            n = event.get("clone_len")
        else:
            continue
        written[id(touched.entry)] += n
        entries[id(touched.entry)] = touched.entry

print("\n".join(statistics_lines(statistics)))
print()
print("top 10 files by bytes written:")
for key, n in written.most_common(10):
    path = entries[key].final_path()
    print(f"{n:>12}  {escape(path).decode('utf-8', 'replace') if path is not None else '(deleted)'}")
