"""The CLI's last word on a broken pipe: quiet only when standard output's reader went away (which a
process of its own tells: tests/integration/test_cli.py)."""

from __future__ import annotations

import errno

import click
import pytest

from sendstream.cli.terminal import Group, run_command, standard_output_gone


def broken() -> click.Group:
    @click.group(cls=Group)
    def group() -> None:
        pass

    @group.command()
    def write() -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")  # as a socket's or a child's pipe says it

    return group


def test_a_broken_pipe_that_is_not_standard_outputs_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert not standard_output_gone()
    assert run_command(broken(), ["write"]) == 4
    assert capsys.readouterr().err == "sendstream: error: Broken pipe\n"
