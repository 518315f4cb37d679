"""``sendstream`` with every :class:`~sendstream.io.outputs.OutputFile` writing short now and then
(:class:`support.storing.ShortFileIO`): ``python short_serve.py serve --config FILE``. It says how
many writes were short as its last line on stderr."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sendstream.__main__ import run
from support.storing import ShortFileIO, writing_through

with writing_through(ShortFileIO) as tally:
    try:
        run()
    finally:
        print(f"short writes: {tally.short}", file=sys.stderr)
