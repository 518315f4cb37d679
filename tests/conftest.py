"""Fixtures of every test module: each fixture stream, a pre-shared key file."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.net import key_file
from support.streams import STREAMS, stream_ids


@pytest.fixture(params=STREAMS, ids=stream_ids)
def stream_path(request: pytest.FixtureRequest) -> Path:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def key(tmp_path: Path) -> Path:
    """A pre-shared key file of the test."""
    return key_file(tmp_path / "psk.key")
