"""Fixtures of every test module: each fixture stream, a pre-shared key file, each codec backend;
Hypothesis's profiles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings
from support.net import key_file
from support.streams import STREAMS, stream_ids

from sendstream.codec.backend import Backend, native, pure

# How many examples each property test tries: a few in the inner loop (dev, the default), many in CI
# (.ci/run sets HYPOTHESIS_PROFILE=ci). Loaded here, before the test modules: their @settings build on it.
settings.register_profile("dev", max_examples=30)
settings.register_profile("ci", max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(params=STREAMS, ids=stream_ids)
def stream_path(request: pytest.FixtureRequest) -> Path:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def key(tmp_path: Path) -> Path:
    """A pre-shared key file of the test."""
    return key_file(tmp_path / "psk.key")


@pytest.fixture(scope="session", params=["native", "pure"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each codec backend: the native one (skipped when the module is not built), the pure one.
    A subprocess takes the same one with :func:`support.streams.backend_env`."""
    if request.param == "pure":
        return pure()
    built = native()
    if built is None:
        pytest.skip("the native module is not built (no compiler at install time)")
    return built


KINDS = ("unit", "integration", "system", "soak")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test's kind is its folder's: ``-m unit`` is the inner loop, ``-m "not soak"`` all but the soak tier."""
    for item in items:
        kind = item.path.parent.name
        if kind in KINDS:
            item.add_marker(kind)
