"""Send and receive a real fixture stream in every TLS mode, and check that
both directions of both ends ran in the kernel and the bytes arrived intact.

Runs where the kernel has kTLS: `python3 tools/ktls_vm.py run -- python3
tools/ktls_transport.py` boots one (see TRANSPORT.md). Prints one line per
mode and `KTLS_TRANSPORT_OK` when every usable mode passed; exits non-zero
otherwise.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this tree's sendstream, here and in the children, not an installed one
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from sendstream.transport.tls import MODES, why_unavailable  # noqa: E402

STREAM = ROOT / "fixtures" / "rich-full-v2.stream"
KERNEL_BOTH = "TX kernel, RX kernel"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_mode(mode: str, key: Path, scratch: Path) -> str | None:
    """None when the mode passed, else what went wrong."""
    port = free_port()
    out = scratch / f"{mode}.stream"
    cmd = [sys.executable, "-m", "sendstream"]
    tls = ["--tls", mode, "--key", str(key), "-v"]
    receiver = subprocess.Popen(
        [*cmd, "receive", "--listen", f"127.0.0.1:{port}", "-o", str(out), *tls], stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    while True:
        sender = subprocess.run([*cmd, "send", "--to", f"127.0.0.1:{port}", str(STREAM), *tls], capture_output=True)
        if b"refused" not in sender.stderr or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    _, receiver_err = receiver.communicate(timeout=300)
    said = sender.stderr.decode() + receiver_err.decode()
    if sender.returncode or receiver.returncode:
        return f"exit codes {sender.returncode}/{receiver.returncode}: {said}"
    if hashlib.sha256(out.read_bytes()).digest() != hashlib.sha256(STREAM.read_bytes()).digest():
        return "the received bytes differ"
    if KERNEL_BOTH not in sender.stderr.decode() or KERNEL_BOTH not in receiver_err.decode():
        return f"not both ends with {KERNEL_BOTH!r}: {said}"
    return None


def main() -> int:
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        key = scratch / "psk"
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
        for mode in MODES[1:]:
            if reason := why_unavailable(mode):
                print(f"{mode}: skipped: {reason}")
                continue
            problem = one_mode(mode, key, scratch)
            print(f"{mode}: {'ok, ' + KERNEL_BOTH + ' on both ends' if problem is None else 'FAILED: ' + problem}")
            failed += problem is not None
    if not failed:
        print("KTLS_TRANSPORT_OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
