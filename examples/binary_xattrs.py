"""Extended attributes whose values are binary (not printable UTF-8 text).

Usage: python3 binary_xattrs.py STREAM

Prints the final path, the attribute name and the value in hex (the first
32 bytes), e.g. file capabilities (security.capability) or hidden payloads.
"""

import sys

from sendstream import Command
from sendstream.analysis.paths import PathTracker
from sendstream.io.windows import file_events
from sendstream.render.dump import escape


def is_binary(value: bytes) -> bool:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return not all(c.isprintable() or c in "\t\n" for c in text)


tracker = PathTracker()
found = []
with open(sys.argv[1], "rb") as stream:
    for event in file_events(stream):
        if not isinstance(event, Command):
            continue
        touched = tracker.feed(event)
        if event.name == "set_xattr" and touched is not None:
            value = bytes(event.get("xattr_data"))  # copy: values are only valid until the next event
            if is_binary(value):
                found.append((touched.entry, bytes(event.get("xattr_name")), value))

for entry, name, value in found:
    path = entry.final_path()
    shown = escape(path).decode("utf-8", "replace") or "." if path is not None else "(deleted)"
    more = "..." if len(value) > 32 else ""
    print(f"{shown}  {escape(name).decode('utf-8', 'replace')}  {len(value)} bytes  {value[:32].hex()}{more}")
