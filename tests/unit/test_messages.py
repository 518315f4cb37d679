"""The session protocol's parsers and the resume token's, against every malformed input (issue 11, finding 4).
The options every object-store command takes are in tests/integration/test_endpoint_option.py.

Rule: a parser returns typed values or raises our own error (SessionError,
ResumeError for tokens); nothing else, whatever the bytes. An option gets a
one-line error that names it, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.streams import FIXTURES

from sendstream.errors import ResumeError, SessionError
from sendstream.session.messages import parse_ack, parse_answer, parse_hello, parse_status
from sendstream.transfer.identity import json_depth, printable, stream_identity
from sendstream.transfer.ledger import Checkpoint
from sendstream.transfer.tokens import _b64, _mac, make_token, read_token

IDENTITY = stream_identity((FIXTURES / "rich-full-v2.stream").read_bytes()[:65536])
HEAD = b"sendstream-session 1 "
KEY = bytes(range(32))
LEDGER = "0" * 64


def hello(obj: Any) -> bytes:
    return HEAD + json.dumps(obj).encode() + b"\n"


def with_identity(**changes: Any) -> dict[str, Any]:
    return {**IDENTITY, **changes}


DEEP = b"[" * 100_000 + b"]" * 100_000
BAD_HELLOS = {
    "bad JSON": HEAD + b"{bad\n",
    "a JSON list": hello([1, 2]),
    "a JSON string": hello("x"),
    "a number": hello(7),
    "deeply nested arrays": HEAD + DEEP + b"\n",
    "nested in the stream": hello({"stream": [[[[[[1]]]]]]}),
    "not UTF-8": HEAD + b"\xff\xfe\n",
    "UTF-16 with a BOM": HEAD + '{"stream": {}}'.encode("utf-16") + b"\n",
    "no stream": hello({"hello": 1}),
    "stream a list": hello({"stream": [1]}),
    "stream a string": hello({"stream": "x"}),
    "stream null": hello({"stream": None}),
    "a field missing": hello({"stream": {k: v for k, v in IDENTITY.items() if k != "uuid"}}),
    "an unknown field": hello({"stream": with_identity(extra=1)}),
    "a list value": hello({"stream": with_identity(uuid=[1])}),
    "an object value": hello({"stream": with_identity(command={})}),
    "a bool for an integer": hello({"stream": with_identity(ctransid=True)}),
    "a float for an integer": hello({"stream": with_identity(ctransid=1.5)}),
    "a negative integer": hello({"stream": with_identity(ctransid=-1)}),
    "an integer over 64 bits": hello({"stream": with_identity(ctransid=1 << 64)}),
    "an integer of 5000 digits": HEAD + b'{"stream": {"ctransid": ' + b"9" * 5000 + b"}}\n",
    "a string for an integer": hello({"stream": with_identity(prefix="65536")}),
    "an integer for a string": hello({"stream": with_identity(uuid=5)}),
    "no digest": hello({"stream": with_identity(sha256=None)}),
    "NaN": HEAD + b'{"stream": {"ctransid": NaN}}\n',
    "another version": b"sendstream-session 2 " + json.dumps({"stream": IDENTITY}).encode() + b"\n",
    "another protocol": b"GET / HTTP/1.1\r\n",
}


@pytest.mark.parametrize("line", BAD_HELLOS.values(), ids=BAD_HELLOS.keys())
def test_malformed_hellos_are_session_errors(line: bytes) -> None:
    with pytest.raises(SessionError):
        parse_hello(line)


def test_a_good_hello_and_the_depth_check() -> None:
    assert parse_hello(hello({"stream": IDENTITY})) == IDENTITY
    assert parse_hello(hello({"stream": with_identity(uuid=None, ctransid=None)}))["uuid"] is None
    assert json_depth(b'{"a": "[[[[{{{{", "b": [1, {"c": "\\"]]]"}]}') == 3
    assert json_depth(DEEP) == 100_000
    with pytest.raises(SessionError, match="nests JSON 100000 deep, more than 4"):
        parse_hello(HEAD + DEEP + b"\n")


BAD_ANSWERS = {
    "bad JSON": HEAD + b"{bad\n",
    "a JSON list": HEAD + b"[0, 0]\n",
    "a JSON string": HEAD + b'"0"\n',
    "deeply nested arrays": HEAD + DEEP + b"\n",
    "not UTF-8": HEAD + b'{"verified": 0, "resume": "\xff"}\n',
    "a non-integer verified": HEAD + b'{"verified": "x", "resume": 0}\n',
    "a float verified": HEAD + b'{"verified": 1.5, "resume": 2}\n',
    "a bool verified": HEAD + b'{"verified": true, "resume": 1}\n',
    "a negative resume": HEAD + b'{"verified": 0, "resume": -1}\n',
    "no resume": HEAD + b'{"verified": 0}\n',
    "resume before verified": HEAD + b'{"verified": 10, "resume": 5}\n',
    "a huge offset": HEAD + b'{"verified": 0, "resume": 99999999999999999999999}\n',
    "another version": b'sendstream-session 9 {"verified": 0, "resume": 0}\n',
    "not the session protocol": b"HTTP/1.1 200 OK\n",
}


@pytest.mark.parametrize("line", BAD_ANSWERS.values(), ids=BAD_ANSWERS.keys())
def test_malformed_answers_are_session_errors(line: bytes) -> None:
    with pytest.raises(SessionError):
        parse_answer(line)


BAD_STATUSES = {
    "a superscript two": "sendstream-status ² failed\n".encode(),
    "Arabic-Indic digits": "sendstream-status ٣ failed\n".encode(),
    "no code": b"sendstream-status  failed\n",
    "nothing": b"sendstream-status \n",
    "over 255": b"sendstream-status 256 failed\n",
    "four digits": b"sendstream-status 1000 failed\n",
    "negative": b"sendstream-status -1 failed\n",
    "letters after the digits": b"sendstream-status 1x failed\n",
    "no prefix": b"OK 0\n",
}


@pytest.mark.parametrize("line", BAD_STATUSES.values(), ids=BAD_STATUSES.keys())
def test_malformed_statuses_are_session_errors(line: bytes) -> None:
    with pytest.raises(SessionError, match="malformed status line"):
        parse_status(line)


def test_good_statuses_and_what_a_message_may_hold() -> None:
    assert parse_status(b"sendstream-status 0 ok\n") == (0, "ok")
    assert parse_status(b"sendstream-status 255\n") == (255, "")
    assert parse_status(b"sendstream-status 4 No space left on device: '/b'\n") == (4, "No space left on device: '/b'")
    # a receiver's words must not drive the sender's terminal
    assert parse_status(b"sendstream-status 1 \x1b[2Jgone\xff\n") == (1, "\\x1b[2Jgone\ufffd")
    assert printable("a\nb\tc") == "a\\nb\\tc"


@pytest.mark.parametrize("line", [b"ack \xc2\xb2\n", b"ack -1\n", b"ack 1x\n", b"ack \n", b"ack " + b"9" * 30 + b"\n"])
def test_malformed_acks_are_session_errors(line: bytes) -> None:
    with pytest.raises(SessionError):
        parse_ack(line)


def test_a_good_ack() -> None:
    assert parse_ack(b"ack 123\n") == 123


# --- resume tokens ----------------------------------------------------------------------------------------------------


def token(payload: bytes) -> str:
    """A token holding ``payload``, validly MACed: only a key holder can make one."""
    return f"ssr1.{_b64(payload)}.{_b64(_mac(KEY, payload))}"


def fields(**changes: Any) -> bytes:
    good = {"stream": IDENTITY, "offset": 1000, "commands": 10, "ledger": LEDGER}
    return json.dumps({**good, **changes}).encode()


BAD_TOKENS = {
    "stream a JSON list": fields(stream=[1, 2]),
    "stream a string": fields(stream="x"),
    "stream with a list value": fields(stream=with_identity(uuid=[])),
    "offset a string": fields(offset="1000"),
    "offset a bool": fields(offset=True),
    "offset negative": fields(offset=-1),
    "commands a float": fields(commands=1.0),
    "ledger a number": fields(ledger=5),
    "ledger not hex": fields(ledger="x" * 64),
    "a field missing": json.dumps({"stream": IDENTITY, "offset": 1, "commands": 1}).encode(),
    "an unknown field": fields(more=1),
    "a list": b"[1, 2, 3]",
    "bad JSON": b"{bad",
    "not UTF-8": b'{"\xff": 1}',
    "deeply nested": b"[" * 2000 + b"]" * 2000,
}


@pytest.mark.parametrize("payload", BAD_TOKENS.values(), ids=BAD_TOKENS.keys())
def test_malformed_tokens_are_resume_errors(payload: bytes) -> None:
    with pytest.raises(ResumeError, match="the resume token is malformed"):
        read_token(token(payload), KEY)


def test_a_good_token_round_trips() -> None:
    checkpoint = Checkpoint(IDENTITY, 1000, 10, LEDGER)
    assert read_token(make_token(checkpoint, KEY), KEY) == checkpoint
    assert read_token(token(fields()), KEY) == checkpoint


# --- whatever the bytes: our error or success ---------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
KEYS = st.sampled_from([*IDENTITY, "stream", "verified", "resume", "offset", "commands", "ledger", "x"])
OBJECTS = st.dictionaries(KEYS, JSON, max_size=9) | st.fixed_dictionaries(
    {"stream": st.dictionaries(KEYS, JSON, max_size=9) | st.just(IDENTITY)}, optional={"x": JSON}
)
PARSERS = [parse_hello, parse_answer, parse_status, parse_ack]
PREFIXES = st.sampled_from([b"", HEAD, b"sendstream-status ", b"ack ", b"sendstream-session 1"])


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(prefix=PREFIXES, data=st.binary(max_size=300), parser=st.sampled_from(PARSERS))
def test_random_bytes(prefix: bytes, data: bytes, parser: Any) -> None:
    with contextlib.suppress(SessionError):
        parser(prefix + data)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(obj=OBJECTS | JSON, parser=st.sampled_from([parse_hello, parse_answer]))
def test_random_json(obj: Any, parser: Any) -> None:
    with contextlib.suppress(SessionError):
        parser(HEAD + json.dumps(obj).encode() + b"\n")


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(payload=OBJECTS.map(lambda o: json.dumps(o).encode()) | st.binary(max_size=200))
def test_random_tokens(payload: bytes) -> None:
    with contextlib.suppress(ResumeError):
        read_token(token(payload), KEY)
