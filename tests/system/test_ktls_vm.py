"""Real kernel TLS: sender and receiver in a VM whose kernel has kTLS.

These machines' own kernel has no CONFIG_TLS; tools/ktls_vm.py boots
Debian's 6.1 kernel under qemu (software emulation, ~25 s) and
tools/ktls_transport.py runs every TLS mode there, checking that TX and RX
of both ends were in the kernel and the bytes arrived intact. Both are run
as programs.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.streams import ROOT

pytestmark = pytest.mark.vm

KTLS_VM = [sys.executable, str(ROOT / "tools" / "ktls_vm.py")]


def test_every_tls_mode_in_the_kernel() -> None:
    missing = subprocess.run([*KTLS_VM, "missing"], capture_output=True, text=True, check=True).stdout.split()
    if missing:
        pytest.skip(f"no kTLS VM here (missing: {', '.join(missing)}); `python3 tools/ktls_vm.py ensure` installs it")
    command = f"{sys.executable} tools/ktls_transport.py"
    vm = subprocess.run(
        [*KTLS_VM, "run", "--timeout", "900", "--cwd", str(ROOT), "--", command], capture_output=True, text=True
    )
    code, output = vm.returncode, vm.stdout
    assert code == 0 and "KTLS_TRANSPORT_OK" in output, output + vm.stderr
    for mode in ("tls12-aes128-gcm", "tls12-aes256-gcm", "tls13-aes128-gcm", "tls13-aes256-gcm"):
        assert f"{mode}: ok, TX kernel, RX kernel on both ends" in output
