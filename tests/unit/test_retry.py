"""The one retry policy (sendstream.io.retry): how long it waits, what it tries again, when it gives up."""

from __future__ import annotations

import pytest

from sendstream.io.retry import MAX_BACKOFF, Retry


def test_waits_double_up_to_the_cap() -> None:
    assert [Retry(9, 1.0).wait(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, MAX_BACKOFF, MAX_BACKOFF]
    assert Retry(3, 0.0).wait(3) == 0


def test_a_transient_failure_is_tried_again_and_said() -> None:
    failures = iter([ConnectionRefusedError("refused"), TimeoutError("slow")])
    said: list[str] = []
    slept: list[float] = []

    def request() -> str:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return "in"

    assert Retry(2, 0.5).call(request, lambda exc: True, said.append, slept.append) == "in"
    assert slept == [0.5, 1.0] and said == ["refused; retry 1/2 in 0.5 s", "slow; retry 2/2 in 1 s"]


def test_it_gives_up_after_its_retries_and_at_once_on_what_will_not_pass() -> None:
    calls: list[int] = []

    def failing() -> None:
        calls.append(1)
        raise ConnectionRefusedError("refused")

    with pytest.raises(ConnectionRefusedError):
        Retry(3, 0.0).call(failing, lambda exc: True, sleep=lambda s: None)
    assert len(calls) == 4
    calls.clear()
    with pytest.raises(ConnectionRefusedError):
        Retry(3, 0.0).call(failing, lambda exc: False, sleep=lambda s: None)
    assert len(calls) == 1
