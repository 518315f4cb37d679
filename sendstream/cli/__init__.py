"""The command line: options in, one library call, output.

``main`` holds the group, the stream commands and the one place that maps errors to exit codes;
``remote`` send, receive and relay; ``admin`` key, man, serve and ``send --list``'s printing;
``archive`` restore and ``archive ls``/``prune``; ``options`` every option, declared once, and
``params`` their types; ``terminal`` what the person at the terminal sees and types; ``manual``
the examples and the manual pages. Only ``main`` loads at a command's start: the group loads the
module of another command when it runs.
"""

from .main import cli, main

__all__ = ["cli", "main"]
