"""``python -m sendstream.format``: generate the runtime layout, Python and C, from the declarations."""

from .generate import main

main()
