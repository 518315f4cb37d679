"""MkDocs hooks: the command-line reference is made at build time from the click declarations (as
``sendstream man`` makes the manual page), so the page cannot drift from the commands."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- cli: made at build time by docs/hooks.py -->"
# The docstrings' Sphinx roles (:class:`~.events.Restart`), as mkdocstrings leaves them: the name alone
ROLE = re.compile(r":(?:class|meth|func|data|attr|mod|exc|obj):<code>~?\.?(?:[\w.]*\.)?(\w+)</code>")


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    sys.path.insert(0, str(ROOT))  # this checkout's package, whatever is installed
    from sendstream.cli import cli
    from sendstream.cli.manual import markdown as reference

    return markdown.replace(MARKER, reference(cli))


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    return ROLE.sub(r"<code>\1</code>", html)
