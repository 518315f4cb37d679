"""What a person meets: terminals, Ctrl-C, keys, messages that say what to do, progress, `--exec` by sh."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.clock import Clock
from support.net import CMD, free_port, key_file, listening, receiver, sender, wait_listening
from support.pipeline import Pipeline
from support.streams import ROOT, SAMPLE
from support.terminal import Pty

from sendstream.session.sender import SessionSender
from sendstream.transfer.progress import Progress, Summary, parse_mode, size
from sendstream.transport.tls.keys import fingerprint, load_key, text_key_trap

ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def on_a_terminal(args: list[str], side: str, timeout: float = 20) -> tuple[int, str]:
    """Run ``sendstream ARGS`` with its stdin or stdout (``side``) a pseudo-terminal; its exit code and what
    it wrote there and on stderr."""
    screen = Pty()
    other = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE}
    other[side] = screen.slave
    proc = subprocess.Popen([*CMD, *args], stderr=subprocess.PIPE, env=ENV, **other)  # type: ignore[call-overload]
    screen.started()
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, screen.text() + err.decode(errors="replace")


@pytest.mark.parametrize(
    "args",
    [["dump"], ["verify"], ["paths"], ["stats"], ["dump", "-"], ["repair", "-", "out"], ["send", "--to", "h:1"]],
    ids=["dump", "verify", "paths", "stats", "dump-dash", "repair", "send"],
)
def test_a_stream_is_never_read_from_a_terminal(args: list[str]) -> None:
    code, text = on_a_terminal(args, "stdin")
    assert code == 2, text
    assert "Usage: sendstream" in text and "standard input is a terminal" in text, text


@pytest.mark.parametrize(
    "args",
    [
        ["repair", str(SAMPLE), "-"],
        ["convert", str(SAMPLE), "-"],
        ["receive", "--listen", "127.0.0.1:{port}"],
        ["restore", "s3://bucket/host/rich_base", "--endpoint-url", "http://127.0.0.1:{port}"],
        ["restore", "s3://bucket/host/rich_base", "-o", "-", "--endpoint-url", "http://127.0.0.1:{port}"],
    ],
    ids=["repair", "convert", "receive", "restore", "restore-dash"],
)
def test_a_stream_is_never_written_to_a_terminal(args: list[str]) -> None:
    port = free_port()
    code, text = on_a_terminal([a.format(port=port) for a in args], "stdout")
    assert code == 2, text
    assert "refusing to write a stream to a terminal" in text, text
    assert not listening(port)


def test_a_file_is_read_with_a_terminal_as_stdin_and_text_goes_to_one() -> None:
    code, text = on_a_terminal(["dump", str(SAMPLE)], "stdin")
    assert code == 0 and "Usage" not in text
    code, text = on_a_terminal(["dump", str(SAMPLE)], "stdout")
    assert code == 0 and "subvol          ./rich_base" in text, text


def test_version_has_a_short_flag() -> None:
    short = subprocess.run([*CMD, "-V"], capture_output=True, env=ENV)
    long = subprocess.run([*CMD, "--version"], capture_output=True, env=ENV)
    assert short.returncode == 0 and short.stdout == long.stdout and short.stdout.startswith(b"sendstream, version")


def test_ctrl_c_is_interrupted_and_130(tmp_path: Path) -> None:
    port = free_port()
    proc = receiver("receive", "--listen", f"127.0.0.1:{port}", "-o", str(tmp_path / "out"), "--tls", "none")
    wait_listening(port)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    assert b"sendstream: interrupted" in err and b"Aborted" not in err and b"Traceback" not in err, err


# --exec runs through sh -c


def test_exec_runs_a_shell_pipeline(tmp_path: Path) -> None:
    out = tmp_path / "out"
    port = free_port()
    recv = receiver("receive", "--listen", f"127.0.0.1:{port}", "--tls", "none", "--exec", f"cat | cat > '{out}'")
    wait_listening(port)
    sent = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none")
    _, err = recv.communicate(timeout=60)
    assert (sent.returncode, recv.returncode) == (0, 0), (sent.stderr, err)
    assert out.read_bytes() == SAMPLE.read_bytes()


def test_a_child_that_does_not_end_after_a_failed_transfer_is_terminated(tmp_path: Path) -> None:
    """The sender's stream is cut short; the child, its input ended, sleeps on: terminated, not waited for."""
    cut = tmp_path / "cut.stream"
    cut.write_bytes(SAMPLE.read_bytes()[:150_000])
    port = free_port()
    recv = receiver(
        "receive", "--listen", f"127.0.0.1:{port}", "--tls", "none", "--exec", "cat > /dev/null; exec sleep 60"
    )
    wait_listening(port)
    started = time.monotonic()
    sent = sender("--to", f"127.0.0.1:{port}", str(cut), "--tls", "none")
    _, err = recv.communicate(timeout=30)
    assert sent.returncode == 3 and recv.returncode == 3, (sent.stderr, err)
    assert time.monotonic() - started < 20, "the receiver waited for its child to end"
    assert b"truncated" in err and b"Traceback" not in err, err


def test_exec_of_a_missing_command_says_so() -> None:
    port = free_port()
    recv = receiver("receive", "--listen", f"127.0.0.1:{port}", "--tls", "none", "--exec", "no-such-command-here")
    wait_listening(port)
    sent = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none")
    _, err = recv.communicate(timeout=60)
    assert recv.returncode == 7 and sent.returncode == 7, (sent.stderr, err)
    assert b"'no-such-command-here' exited (status 127: sh found no such command) before it read" in err, err


# keys


def test_key_new_writes_an_armoured_private_key_and_its_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "k"
    made = subprocess.run([*CMD, "key", "new", str(path)], capture_output=True, env=ENV)
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert text.startswith("-----BEGIN SENDSTREAM PSK-----\n") and text.endswith("-----END SENDSTREAM PSK-----\n")
    key = load_key(path)
    assert len(key) == 32
    shown = subprocess.run([*CMD, "key", "fingerprint", str(path)], capture_output=True, env=ENV)
    assert shown.stdout == made.stdout == f"{fingerprint(key)} {path}\n".encode()
    assert shown.stderr == b""  # an armoured key is no trap
    again = subprocess.run([*CMD, "key", "new", str(path)], capture_output=True, env=ENV)
    assert again.returncode == 2 and b"exists: a key file is never overwritten" in again.stderr
    assert load_key(path) == key


@pytest.mark.parametrize(
    ("content", "trap"),
    [
        (b"q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq80=\n", "look like base64"),  # openssl rand -base64 32
        (b"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", "look like hex"),
        (b"correct horse battery staple\n", "it is text and the trailing newline is part of it"),
    ],
    ids=["base64", "hex", "text-with-newline"],
)
def test_a_raw_key_that_looks_like_text_is_used_as_stored_with_a_warning(
    content: bytes, trap: str, tmp_path: Path
) -> None:
    path = tmp_path / "k"
    path.write_bytes(content)
    path.chmod(0o600)
    shown = subprocess.run([*CMD, "key", "fingerprint", str(path)], capture_output=True, env=ENV)
    assert shown.returncode == 0
    # the same bytes as before (deployed keys keep working): the fingerprint is that of the file as it is
    fp = "sha256:" + hashlib.sha256(content).hexdigest()[:16]
    assert shown.stdout == f"{fp} {path}\n".encode()
    err = shown.stderr.decode()
    assert f"its {len(content)} bytes are the key exactly as stored" in err and trap in err and fp in err, err


def test_a_binary_key_is_no_trap() -> None:
    assert text_key_trap(bytes(range(256))) is None
    assert text_key_trap(os.urandom(32) + b"\x00") is None
    assert text_key_trap(b"no newline, just text") is None


def test_a_missing_key_file_is_an_io_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [*CMD, "send", "--to", "127.0.0.1:9", str(SAMPLE), "--key", str(tmp_path / "nope")],
        capture_output=True,
        env=ENV,
    )
    assert result.returncode == 4
    assert (
        result.stderr
        == f"sendstream: error: cannot read key file '{tmp_path / 'nope'}': No such file or directory\n".encode()
    )


def test_a_wrong_key_is_named_with_both_fingerprints(tmp_path: Path) -> None:
    key, other = key_file(tmp_path / "key"), key_file(tmp_path / "other")
    port = free_port()
    recv = receiver("receive", "--listen", f"127.0.0.1:{port}", "-o", str(tmp_path / "out"), "--key", str(key))
    try:
        wait_listening(port)
        wrong = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--key", str(other))
        time.sleep(0.5)
    finally:
        recv.send_signal(signal.SIGTERM)
        _, err = recv.communicate(timeout=20)
    told = wrong.stderr.decode()
    assert wrong.returncode == 6, told
    assert f"wrong key or identity (local fingerprint {fingerprint(load_key(other))}, identity 'sendstream'" in told
    assert "alert" not in told and "Illegal" not in told, told
    assert f"wrong key or identity (local fingerprint {fingerprint(load_key(key))}" in err.decode(), err


# messages that name the address and the operation


def test_a_refused_connection_names_the_address() -> None:
    port = free_port()
    plain = subprocess.run(
        [*CMD, "send", "--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none", "-q", "--retries", "0"],
        capture_output=True,
        env=ENV,
    )
    assert plain.returncode == 4
    assert plain.stderr.endswith(
        f"sendstream: error: connecting to 127.0.0.1:{port}: connection refused "
        "(is a receiver listening there?)\n".encode()
    ), plain.stderr
    session = subprocess.run(
        [
            *CMD,
            "send",
            "--to",
            f"127.0.0.1:{port}",
            str(SAMPLE),
            "--tls",
            "none",
            "-q",
            "--resumable",
            "--retries",
            "1",
            "--retry-delay",
            "0.01",
        ],
        capture_output=True,
        env=ENV,
    )
    err = session.stderr.decode()
    assert session.returncode == 4, err
    assert (
        f"no connection, and 1 more attempt failed; the last: connecting to 127.0.0.1:{port}: connection refused" in err
    )
    assert "send --resume TOKEN" in err and "Errno" not in err


def test_a_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [*CMD, "receive", "--listen", f"127.0.0.1:{port}", "--tls", "none", "-o", str(tmp_path / "o")],
            capture_output=True,
            env=ENV,
        )
    assert result.returncode == 4
    assert result.stderr.endswith(
        f"sendstream: error: listening on 127.0.0.1:{port}: address already in use "
        "(another process listens there: stop it or choose another port)\n".encode()
    ), result.stderr


# progress like pv


class Screen:
    def __init__(self, tty: bool) -> None:
        self.text = ""
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_sizes_are_binary_with_three_digits() -> None:
    assert [size(n) for n in (0, 999, 1000, 1024, 10 << 20, 1141827461, 5 << 40)] == [
        "0 B",
        "999 B",
        "0.98 KiB",
        "1.00 KiB",
        "10.0 MiB",
        "1.06 GiB",
        "5.00 TiB",
    ]


def test_the_bar_shows_rate_percentage_and_eta() -> None:
    clock, screen = Clock(), Screen(tty=True)
    progress = Progress("sent", total=4 << 30, stream=screen, timer=clock)
    clock.now += 10
    progress.add(1 << 30)
    assert screen.text == "\rsent 1.00 GiB 0:00:10 [102 MiB/s]  25% ETA 0:00:30\x1b[K"
    progress.note("connection lost; retry 2/5 in 4 s")
    assert screen.text.endswith(
        "\rsent 1.00 GiB 0:00:10 [102 MiB/s]  25% ETA 0:00:30: connection lost; retry 2/5 in 4 s\x1b[K"
    )
    progress.above("At snapshot snap2")
    assert screen.text.endswith("\r\x1b[KAt snapshot snap2\n")  # the bar is cleared first: no mixed line
    clock.now += 0.1
    progress.add(1)  # within 0.25 s of the last redraw: not redrawn
    assert screen.text.endswith("snap2\n")
    progress.done()
    assert screen.text.endswith("snap2\n")  # nothing drawn since: nothing to clear


def test_plain_progress_is_a_log_line_every_interval() -> None:
    clock, screen = Clock(), Screen(tty=False)
    mode, every = parse_mode("plain:30")
    progress = Progress("received", mode=mode, every=every, stream=screen, timer=clock)
    for _ in range(7):
        clock.now += 10
        progress.add(10 << 20)
    assert screen.text.splitlines() == [
        "sendstream: received 30.0 MiB 0:00:30 [1.00 MiB/s]",
        "sendstream: received 60.0 MiB 0:01:00 [1.00 MiB/s]",
    ]
    assert Progress("x", stream=Screen(tty=False)).mode == "none"  # auto: no terminal, no bar
    for bad in ("plain:0", "bar:3", "loud", "plain:x"):
        with pytest.raises(ValueError):
            parse_mode(bad)


def test_the_summary_uses_the_same_units_and_keeps_the_ktls_note_for_verbose() -> None:
    summary = Summary(1141827461, 2.5, "tls13-aes128-gcm, TX user, RX user (no kTLS: TCP_ULP tls: No such file)")
    assert (
        summary.line("sent")
        == "sent 1.06 GiB (1,141,827,461 bytes) in 2.50 s [436 MiB/s]; tls13-aes128-gcm, TX user, RX user"
    )
    assert summary.line("sent", verbose=True).endswith("RX user (no kTLS: TCP_ULP tls: No such file)")


def test_a_retry_is_told_as_it_begins() -> None:
    told: list[str] = []
    port = free_port()

    def connect():  # type: ignore[no-untyped-def]
        return socket.create_connection(("127.0.0.1", port))

    sending = SessionSender(connect, retries=2, retry_delay=0.01, notice=told.append)
    with pytest.raises(Exception, match="no connection, and 2 more attempts failed"):
        sending.write(b"x" * 100)
        sending.finish()
    assert told == ["no connection; retry 1/2 in 0.01 s", "no connection; retry 2/2 in 0.02 s"]


def test_size_and_progress_options(tmp_path: Path) -> None:
    port = free_port()
    recv = receiver("receive", "--listen", f"127.0.0.1:{port}", "--tls", "none", "-o", str(tmp_path / "o"), "-q")
    wait_listening(port)
    sent = sender(
        "--to",
        f"127.0.0.1:{port}",
        "-",
        "--tls",
        "none",
        "--size",
        "1.5M",
        "--progress",
        "plain:0.000001",
        data=SAMPLE.read_bytes(),
    )
    recv.communicate(timeout=60)
    lines = sent.stderr.decode().splitlines()
    assert sent.returncode == 0, lines
    assert any(line.startswith("sendstream: sent ") and "% ETA " in line for line in lines), lines
    bad = subprocess.run([*CMD, "send", "--to", "h:1", "--size", "12Q", str(SAMPLE)], capture_output=True, env=ENV)
    assert bad.returncode == 2 and b"expected a size such as 123456, 300M or 1.5G" in bad.stderr


def test_a_child_s_stderr_goes_above_the_bar(tmp_path: Path) -> None:
    """btrfs receive's own lines (`At snapshot ...`) are never written into the progress line."""
    data = SAMPLE.read_bytes()
    port = free_port()
    screen = Pty()
    child = "cat > /dev/null; echo 'At snapshot snap2' >&2"
    recv = subprocess.Popen(
        [*CMD, "receive", "--listen", f"127.0.0.1:{port}", "--tls", "none", "--exec", child, "--progress", "bar"],
        stderr=screen.slave,
        env=ENV,
    )
    screen.started()
    wait_listening(port)
    sending = Pipeline(["send", "--to", f"127.0.0.1:{port}", "-", "-q", "--tls", "none"])
    sending.write(data[: len(data) // 2])
    time.sleep(0.6)  # the bar is drawn
    sending.write(data[len(data) // 2 :])
    assert sending.finish()[0] == 0
    assert recv.wait(60) == 0
    text = screen.text()
    assert "\rreceived " in text, text
    before = text[: text.index("At snapshot snap2")]
    assert before.endswith(("\n", "\x1b[K")), repr(text)


# no traceback anywhere: every command, given what people get wrong


def _commands() -> list[list[str]]:
    from sendstream.cli import cli

    found: list[list[str]] = []

    def walk(group: Any, prefix: list[str]) -> None:
        for name, command in sorted(group.commands.items()):
            if hasattr(command, "commands"):
                walk(command, [*prefix, name])
            else:
                found.append([*prefix, name])

    walk(cli, [])
    return found


def _arguments(path: list[str], tmp_path: Path, missing: str) -> list[str]:
    """Everything ``path`` requires, with its input ``missing``; a network end is given a missing key file."""
    from sendstream.cli import cli

    command: Any = cli
    for name in path:
        command = command.commands[name]
    args: list[str] = []
    for param in command.params:
        if param.param_type_name == "argument":
            if param.name == "directory":
                args.append(str(tmp_path))
            elif param.name == "url":  # an archive in object storage: its address, never reached here
                args.append("s3://no-such-bucket-here/p")
            elif param.name == "target":
                args.append(str(tmp_path / "out"))
            elif getattr(param.type, "choices", None):  # a name among a few (man's page), not a file
                args.append(param.type.choices[0])
            else:
                args.append(missing)
        elif param.required:
            args += [param.opts[0], f"127.0.0.1:{free_port()}"]
    archive = any(p.name == "url" for p in command.params)  # --encrypt-key is for archives only
    keys = [o for p in command.params for o in p.opts if o.endswith("-key") and (archive or o != "--encrypt-key")]
    args += [a for k in keys for a in (k, missing)]  # a network end: its key file is missing
    return args


EXIT_CODES = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 130}


@pytest.mark.parametrize("path", _commands(), ids=lambda p: "-".join(p))
def test_every_command_given_bad_input_says_one_line_and_exits_with_its_code(path: list[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-dir" / "no-such-file")
    cases = {"unknown option": ([*path, "--no-such-option"], 2)}
    arguments = _arguments(path, tmp_path, missing)
    if missing in arguments:  # a command that reads or writes a file
        cases["missing file"] = ([*path, *arguments], 4)
    for case, (args, expected) in cases.items():
        result = subprocess.run([*CMD, *args], capture_output=True, env=ENV, stdin=subprocess.DEVNULL, timeout=30)
        err = result.stderr.decode()
        assert result.returncode == expected, (case, args, err)
        assert "Traceback" not in err, (case, args, err)
        errors = [line for line in err.splitlines() if "error:" in line.lower()]
        assert len(errors) == 1, (case, args, err)
        if expected == 4:
            assert missing in errors[0] and "Errno" not in errors[0], (case, args, err)
    assert {code for _, code in cases.values()} <= EXIT_CODES


def test_every_command_given_a_closed_port_says_where(tmp_path: Path) -> None:
    port = free_port()
    for args in (
        ["send", "--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none", "--retries", "0"],
        ["send", "--to", f"127.0.0.1:{port}", str(SAMPLE), "--key", str(key_file(tmp_path / "k")), "--retries", "0"],
    ):
        result = subprocess.run([*CMD, *args], capture_output=True, env=ENV, timeout=30)
        err = result.stderr.decode()
        assert result.returncode == 4 and "Traceback" not in err, err
        assert err.splitlines()[-1] == (
            f"sendstream: error: connecting to 127.0.0.1:{port}: connection refused (is a receiver listening there?)"
        ), err


@pytest.mark.parametrize("path", _commands(), ids=lambda p: "-".join(p))
def test_every_command_s_help_has_an_example(path: list[str]) -> None:
    shown = subprocess.run([*CMD, *path, "-h"], capture_output=True, env=ENV)
    assert shown.returncode == 0 and b"\n  Examples:\n    " in shown.stdout, shown.stdout.decode()
    assert b"sendstream " in shown.stdout.split(b"Examples:")[1]


@pytest.mark.parametrize("words", ["sendstream dump fix", "sendstream repair fix", "sendstream send --to h:1 fix"])
def test_stream_arguments_complete_file_names(words: str) -> None:
    env = dict(ENV, COMP_WORDS=words, COMP_CWORD=str(len(words.split()) - 1), _SENDSTREAM_COMPLETE="bash_complete")
    shown = subprocess.run([*CMD], capture_output=True, env=env, cwd=ROOT)
    assert shown.stdout.decode().splitlines() == ["file,fix"], shown


def test_the_manual_page_has_every_command_and_exit_code() -> None:
    shown = subprocess.run([*CMD, "man"], capture_output=True, env=ENV)
    page = shown.stdout.decode()
    assert shown.returncode == 0 and page.startswith(".TH SENDSTREAM 1 ")
    for path in _commands():
        assert f".SS {' '.join(path)}\n.nf\nsendstream {' '.join(path)} " in page
    for code in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 130):
        assert f".TP\n\\fB{code}\\fR\n" in page
    assert "\\fB\\-\\-max\\-command\\-size BYTES\\fR" in page  # options, escaped for roff


# --rate-limit: a token bucket, checked with a clock of our own


def test_the_token_bucket_keeps_every_window_at_the_rate() -> None:
    from sendstream.transport.pacing import TokenBucket

    rate = 1_000_000.0
    now = 0.0
    bucket = TokenBucket(rate, now)
    assert bucket.burst == 50_000  # 50 ms of the rate
    sent: list[tuple[float, int]] = []  # (time the bytes went, how many)
    for chunk in [1 << 20, 100, 70_000, 3, 1 << 20] * 4:  # writes of any size, split as the channel does
        for start in range(0, chunk, bucket.burst):
            piece = min(bucket.burst, chunk - start)
            now += bucket.delay(piece, now)
            sent.append((now, piece))
            now += 0.0001  # the send itself takes a little
    total, elapsed = sum(n for _, n in sent), sent[-1][0]
    assert abs(total / elapsed - rate) / rate < 0.03  # on average the rate (the first burst is free)
    for since in [t / 10 for t in range(int(elapsed * 10) - 20)]:
        window = sum(n for t, n in sent if since <= t < since + 2)
        assert abs(window - 2 * rate) <= bucket.burst + 0.01 * rate, (since, window)  # within 2.5% + the sends


def test_the_token_bucket_does_not_save_up_while_idle() -> None:
    from sendstream.transport.pacing import TokenBucket

    bucket = TokenBucket(1000.0, 0.0, burst=100)
    assert bucket.delay(100, 0.0) == 0.0  # a full bucket at the start
    assert bucket.delay(100, 0.0) == pytest.approx(0.1)
    assert bucket.delay(100, 60.0) == 0.0  # a minute idle refills the bucket, no more
    assert bucket.delay(100, 60.0) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="more than 0"):
        TokenBucket(0, 0.0)


def test_rate_limited_transfer_is_complete(tmp_path: Path) -> None:
    out = tmp_path / "out"
    port = free_port()
    recv = receiver("receive", "--listen", f"127.0.0.1:{port}", "--tls", "none", "-o", str(out), "-q")
    wait_listening(port)
    sent = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none", "--rate-limit", "4M", "-q")
    recv.communicate(timeout=60)
    assert (sent.returncode, recv.returncode) == (0, 0), sent.stderr
    assert out.read_bytes() == SAMPLE.read_bytes()
    bad = subprocess.run([*CMD, "send", "--to", "h:1", "--rate-limit", "0", str(SAMPLE)], capture_output=True, env=ENV)
    assert bad.returncode == 2 and b"expected a size of at least 1, got '0'" in bad.stderr


# the library for scripts


def test_help_of_the_package_shows_the_public_api_only() -> None:
    import pydoc

    import sendstream

    text = pydoc.render_doc(sendstream, renderer=pydoc.plaintext)  # type: ignore[attr-defined]
    functions = text[text.index("\nFUNCTIONS\n") : text.index("\nDATA\n")]
    names = {
        line.split("(")[0].split(" = ")[0].strip()
        for line in functions.splitlines()[1:]
        if line.startswith("    ") and "(" in line and not line.startswith("     ")
    }
    assert names and names <= set(sendstream.__all__), names - set(sendstream.__all__)
    assert "__getattr__" not in text and "_HOME" not in text


def test_get_says_which_attributes_a_command_has() -> None:
    import sendstream

    write = next(ev for ev in sendstream.events(SAMPLE) if isinstance(ev, sendstream.Command) and ev.name == "write")
    with pytest.raises(KeyError) as missing:
        write.get("mode")
    assert isinstance(missing.value, sendstream.AttributeNotFound)
    assert str(missing.value) == "write has no attribute 'mode'; it has: path, file_offset, data"
    with pytest.raises(sendstream.AttributeNotFound, match="no attribute is called 'pth'; write has: path, "):
        write.get("pth")
    assert write.get("mode", None) is None


def test_verify_and_stats_say_what_each_stream_is() -> None:
    incr = "snapshot rich_incr uuid=0160d3b5-224e-6c4b-a33b-0b7c20846e59 ctransid=9 "
    incr += "parent_uuid=5751d173-386b-2e48-a1ec-5e5bd918dd22 parent_ctransid=7"
    path = str(ROOT / "fixtures" / "rich-incr-v2.stream")
    shown = subprocess.run([*CMD, "verify", path], capture_output=True, env=ENV)
    assert shown.stdout.decode().splitlines()[0] == incr
    stats = subprocess.run([*CMD, "stats", path], capture_output=True, env=ENV)
    assert stats.stdout.decode().splitlines()[0] == f"stream 1 at offset 0, version 2: {incr}"
    two = subprocess.run(
        [*CMD, "verify", str(ROOT / "fixtures" / "two-concat-v2.stream")], capture_output=True, env=ENV
    )
    lines = two.stdout.decode().splitlines()
    assert len(lines) == 3 and lines[0].startswith("subvol two_a_snap ") and lines[1].startswith("subvol two_b_snap ")


def test_a_command_started_with_its_standard_input_closed_works() -> None:
    """cron and some service managers start a process with fd 0 closed: Python's sys.stdin is None."""
    shell = f"exec 0<&-; exec {sys.executable} -m sendstream verify {SAMPLE}"
    done = subprocess.run(["sh", "-c", shell], capture_output=True, env=ENV)
    assert done.returncode == 0 and b"OK: 1 stream" in done.stdout, done.stderr
