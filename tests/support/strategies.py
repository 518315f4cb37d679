"""Hypothesis strategies: commands of every kind with attribute values of their types."""

from __future__ import annotations

import uuid

from hypothesis import strategies as st

from sendstream import Command, Timespec
from sendstream.format.declarations import ATTRIBUTES, COMMANDS, MAX_COMMAND

VALUES = {
    "u8": st.integers(0, 2**8 - 1),
    "u32": st.integers(0, 2**32 - 1),
    "u64": st.integers(0, 2**64 - 1),
    "uuid": st.builds(uuid.UUID, bytes=st.binary(min_size=16, max_size=16)),
    "timespec": st.builds(Timespec, st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**32 - 1)),
    "string": st.binary(max_size=300),
    "bytes": st.binary(max_size=2000),
}


@st.composite
def commands(draw: st.DrawFn, version: int) -> Command:
    spec = draw(st.sampled_from([s for n, s in COMMANDS.items() if n <= MAX_COMMAND[version] and s.name != "end"]))
    names = [ATTRIBUTES[n].name for n in spec.required + spec.optional]
    if spec.optional:
        names = names[: len(spec.required) + draw(st.integers(0, len(spec.optional)))]
    names = draw(st.permutations(names))
    names = [n for n in names if n != "data"] + [n for n in names if n == "data"]  # DATA last (v2+)
    return Command.build(spec.name, [(n, draw(VALUES[ATTRIBUTES[_num(n)].kind])) for n in names])


def _num(name: str) -> int:
    return next(n for n, a in ATTRIBUTES.items() if a.name == name)
