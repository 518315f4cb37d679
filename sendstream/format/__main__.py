"""``python -m sendstream.format``: generate the runtime layout from the declarations."""

from .declarations import main

main()
