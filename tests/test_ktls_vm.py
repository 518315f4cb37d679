"""Real kernel TLS: sender and receiver in a VM whose kernel has kTLS.

These machines' own kernel has no CONFIG_TLS; tools/ktls_vm.py boots
Debian's 6.1 kernel under qemu (software emulation, ~25 s) and
tools/ktls_transport.py runs every TLS mode there, checking that TX and RX
of both ends were in the kernel and the bytes arrived intact.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import ktls_vm  # noqa: E402

pytestmark = pytest.mark.vm


def test_every_tls_mode_in_the_kernel() -> None:
    if missing := ktls_vm.missing():
        pytest.skip(f"no kTLS VM here (missing: {', '.join(missing)}); `python3 tools/ktls_vm.py ensure` installs it")
    code, output = ktls_vm.run_in_vm(f"{sys.executable} tools/ktls_transport.py", ROOT, timeout=900)
    assert code == 0 and "KTLS_TRANSPORT_OK" in output, output
    for mode in ("tls12-aes128-gcm", "tls12-aes256-gcm", "tls13-aes128-gcm", "tls13-aes256-gcm"):
        assert f"{mode}: ok, TX kernel, RX kernel on both ends" in output
