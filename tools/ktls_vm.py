#!/usr/bin/env python3
"""Run commands inside a QEMU VM whose kernel has kTLS (CONFIG_TLS=m).

The host kernel here has no kTLS. This harness boots Debian's packaged kernel
(``linux-image-amd64``, 6.1) with virtme-ng (``vng``) under QEMU software
emulation, sharing the host's root filesystem, and runs a shell command there.

Guest filesystem, as virtme-ng sets it up:

* ``/`` is the host's root over 9p, **read-only**: ``cwd``, ``/work`` and
  ``/root`` (HOME) cannot be written unless listed below.
* ``/etc /lib /home /opt /srv /usr /var /tmp`` are overlays with a tmpfs upper
  layer: writable in the guest (about half the guest RAM), the host's files
  visible below, every change discarded at shutdown. Guest ``/tmp`` is the
  easy scratch space.
* ``rwdirs`` are extra host directories shared read-write (``vng --rwdir``):
  what the guest writes there is on the host afterwards.
* ``overlay_rwdirs`` are host directories made writable in the guest only
  (``vng --overlay-rwdir``), e.g. ``cwd`` when a test writes next to itself.

The command runs as root in bash, with the host Python (``sys.executable``)
first on PATH, so the editable ``sendstream`` install imports as on the host.

Usage::

    python3 tools/ktls_vm.py ensure         # install qemu, kernel, virtme-ng
    python3 tools/ktls_vm.py missing        # what ensure would install, one a line (nothing: ready)
    python3 tools/ktls_vm.py check          # boot, prove kTLS works, timings
    python3 tools/ktls_vm.py run -- CMD...  # run CMD in the VM (cwd = .)

KVM hangs on these machines, so the VM always runs with ``--disable-kvm``;
a boot plus a trivial command takes roughly 20-30 s.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

APT_PACKAGES: tuple[str, ...] = (
    "qemu-system-x86",
    "linux-image-amd64",
    # vng builds a tiny initramfs (9p/virtiofs are modules in Debian's kernel)
    # and refuses a dynamically linked busybox; this replaces `busybox`.
    "busybox-static",
)
PIP_PACKAGES: tuple[str, ...] = ("virtme-ng",)
DEFAULT_MEMORY = "2G"
EXIT_TIMEOUT = 124  # like timeout(1): the VM was killed at the deadline
EXIT_HARNESS = 125  # the VM ended without reporting the command's status

_STATIC_BUSYBOX_NAMES = ("busybox-static", "busybox.static", "busybox")


class KtlsVmError(RuntimeError):
    """The VM cannot be set up (missing tools, no suitable kernel)."""


@dataclass
class VMResult:
    """What one VM run produced."""

    exit_code: int  # the command's own status, or EXIT_TIMEOUT / EXIT_HARNESS
    output: str  # combined stdout+stderr of the guest, markers removed
    boot_seconds: float | None  # host wall time until the command started
    guest_uptime: float | None  # guest /proc/uptime when the command started
    total_seconds: float
    timed_out: bool
    status_reported: bool  # the guest wrote the command's exit status


# --------------------------------------------------------------------------
# Discovery and installation
# --------------------------------------------------------------------------


def _kernel_has_tls(ver: str) -> bool:
    """True if /boot/config-VER has CONFIG_TLS=m or =y and modules exist."""
    config = Path("/boot") / f"config-{ver}"
    try:
        text = config.read_text(errors="replace")
    except OSError:
        return False
    if not re.search(r"^CONFIG_TLS=[my]$", text, re.M):
        return False
    return Path("/lib/modules", ver, "modules.dep").exists()


def _version_key(ver: str) -> tuple[int, ...]:
    """Sort key for kernel release strings like 6.1.0-57-amd64."""
    return tuple(int(n) for n in re.findall(r"\d+", ver))


def find_kernel() -> tuple[str, Path]:
    """Return (version, vmlinuz path) of the newest kTLS-capable /boot kernel."""
    found = []
    for image in Path("/boot").glob("vmlinuz-*"):
        ver = image.name[len("vmlinuz-") :]
        if _kernel_has_tls(ver):
            found.append((ver, image))
    if not found:
        raise KtlsVmError(
            "no /boot/vmlinuz-<ver> with CONFIG_TLS=m|y and /lib/modules/<ver>; run `python3 tools/ktls_vm.py ensure`"
        )
    return max(found, key=lambda vi: _version_key(vi[0]))


def find_vng() -> str | None:
    """Path of the vng launcher (PATH, then next to this Python)."""
    beside = Path(sys.executable).parent / "vng"
    return str(beside) if beside.exists() else shutil.which("vng")


def _is_static_elf(path: str) -> bool:
    """True if the ELF file at path has no PT_INTERP (statically linked)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # ELF64 only
                return False
            end = "<" if head[5] == 1 else ">"
            phoff = struct.unpack_from(end + "Q", head, 0x20)[0]
            phentsize, phnum = struct.unpack_from(end + "HH", head, 0x36)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    pt_interp = 3
    return all(struct.unpack_from(end + "I", table, i * phentsize)[0] != pt_interp for i in range(phnum))


def _has_static_busybox() -> bool:
    """True if vng would find a statically linked busybox."""
    for name in _STATIC_BUSYBOX_NAMES:
        path = shutil.which(name)
        if path and _is_static_elf(path):
            return True
    return False


def missing() -> list[str]:
    """Names of the things ensure() would install."""
    out = []
    if not shutil.which("qemu-system-x86_64"):
        out.append("qemu-system-x86")
    try:
        find_kernel()
    except KtlsVmError:
        out.append("linux-image-amd64")
    if not _has_static_busybox():
        out.append("busybox-static")
    if not find_vng():
        out.append("virtme-ng")
    return out


def _run_logged(argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
    """Run an install step, echoing it; raise KtlsVmError on failure."""
    print("+", shlex.join(argv), file=sys.stderr, flush=True)
    proc = subprocess.run(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise KtlsVmError(f"{shlex.join(argv)} failed ({proc.returncode}):\n{tail}")


def ensure() -> tuple[str, Path]:
    """Install whatever is missing; return (kernel version, vmlinuz path).

    apt runs non-interactively. On Debian 12 the kernel's postinst only runs
    the initramfs-tools hook (no grub here); that touches /boot only and does
    not affect the running kernel. vng builds its own initramfs anyway.
    """
    need = missing()
    apt = [p for p in APT_PACKAGES if p in need]
    if apt:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _run_logged(["apt-get", "update", "-q"], env)
        _run_logged(
            [
                "apt-get",
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "-o",
                "Dpkg::Options::=--force-confdef",
                "-o",
                "Dpkg::Options::=--force-confold",
                *apt,
            ],
            env,
        )
    if "virtme-ng" in need:
        _run_logged([sys.executable, "-m", "pip", "install", "-q", *PIP_PACKAGES])
    still = missing()
    if still:
        raise KtlsVmError(f"still missing after install: {', '.join(still)}")
    return find_kernel()


# --------------------------------------------------------------------------
# Running a command in the VM
# --------------------------------------------------------------------------


def _guest_script(workdir: Path, cwd: Path, nonce: str, env: Mapping[str, str] | None) -> str:
    """The bash script the guest runs around the user's command."""
    path = ":".join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    q = shlex.quote
    lines = [
        f'export PATH={q(path)}:"$PATH" HOME=/root',
        *(f"export {k}={q(v)}" for k, v in (env or {}).items()),
        "ip link set lo up 2>/dev/null",
        'modprobe tls || echo "ktls_vm: modprobe tls failed" >&2',
        f"echo \"__KTLS_VM_START_{nonce}__ $(cut -d' ' -f1 /proc/uptime)\"",
        f"cd {q(str(cwd))} || exit 97",
        f"bash {q(str(workdir / 'command.sh'))} </dev/null",
        "rc=$?",
        f'echo "$rc" > {q(str(workdir / "exit_code"))}',
        f'echo "__KTLS_VM_EXIT_{nonce}__=$rc"',
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def vng_argv(
    kernel: Path, script: Path, cwd: Path, memory: str, rwdirs: Iterable[Path], overlay_rwdirs: Iterable[Path]
) -> list[str]:
    """The vng command line used to boot the VM and run script."""
    vng = find_vng()
    if vng is None:
        raise KtlsVmError("vng not found; run `python3 tools/ktls_vm.py ensure`")
    argv = [vng, "--run", str(kernel), "--disable-kvm", "--user", "root", "--memory", memory, "--cwd", str(cwd)]
    for d in rwdirs:
        argv += ["--rwdir", str(Path(d).resolve())]
    for d in overlay_rwdirs:
        argv += ["--overlay-rwdir", str(Path(d).resolve())]
    # The script goes in a shared file: --exec travels base64-encoded on the
    # kernel command line, which x86 caps at 2048 bytes.
    return [*argv, "--exec", f"bash {shlex.quote(str(script))}"]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the vng/qemu process group we started: TERM, then KILL."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _reap_group(pgid: int, limit: float = 15.0) -> None:
    """Wait until no process of our group (e.g. an orphaned qemu) is left."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def run_in_vm_result(
    command: str,
    cwd: Path,
    timeout: float = 600,
    *,
    memory: str = DEFAULT_MEMORY,
    rwdirs: Sequence[Path] = (),
    overlay_rwdirs: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
    kernel: Path | None = None,
    echo: bool = False,
) -> VMResult:
    """Boot the kTLS kernel, run command (bash) in cwd, return a VMResult.

    timeout bounds the whole run, boot included; at the deadline the VM is
    killed and exit_code is EXIT_TIMEOUT. With echo, guest output is copied
    to stdout as it arrives.
    """
    if kernel is None:
        kernel = find_kernel()[1]
    cwd = Path(cwd).resolve()
    nonce = secrets.token_hex(6)
    start_re = re.compile(rf"__KTLS_VM_START_{nonce}__ ([0-9.]+)")
    exit_re = re.compile(rf"__KTLS_VM_EXIT_{nonce}__=(\d+)")
    with tempfile.TemporaryDirectory(prefix="ktls_vm_") as tmp:
        workdir = Path(tmp)
        (workdir / "command.sh").write_text(command + "\n")
        script = workdir / "guest.sh"
        script.write_text(_guest_script(workdir, cwd, nonce, env))
        argv = vng_argv(kernel, script, cwd, memory, [workdir, *rwdirs], overlay_rwdirs)
        lines: list[str] = []
        marks: dict[str, float] = {}
        t0 = time.monotonic()
        # Output must go to a pipe: vng hands qemu /proc/self/fd/1 several
        # times, and on a regular file the separate opens overwrite each other.
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def reader() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace")
                m = start_re.search(line)
                if m:
                    marks["boot"] = time.monotonic() - t0
                    marks["uptime"] = float(m.group(1))
                    continue
                lines.append(line)
                if echo and not exit_re.search(line):
                    sys.stdout.write(line)
                    sys.stdout.flush()

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _stop(proc)
            _reap_group(proc.pid)
            thread.join(timeout=10)
        total = time.monotonic() - t0

        code: int | None = None
        status_file = workdir / "exit_code"
        if status_file.exists():
            try:
                code = int(status_file.read_text().strip())
            except ValueError:
                code = None
        out_lines = []
        for line in lines:
            m = exit_re.search(line)
            if m:
                if code is None:
                    code = int(m.group(1))
                line = line[: m.start()] + line[m.end() :]
                if not line.strip():
                    continue
            out_lines.append(line)
    reported = code is not None and not timed_out
    if timed_out:
        out_lines.append(f"ktls_vm: killed after {timeout:.0f} s\n")
        final = EXIT_TIMEOUT
    elif code is None:
        out_lines.append(f"ktls_vm: no exit status from the guest (vng exited {proc.returncode})\n")
        final = EXIT_HARNESS
    else:
        final = code
    return VMResult(final, "".join(out_lines), marks.get("boot"), marks.get("uptime"), total, timed_out, reported)


def run_in_vm(command: str, cwd: Path, timeout: float = 600) -> tuple[int, str]:
    """Run command in the kTLS VM; return (exit code, combined output)."""
    res = run_in_vm_result(command, cwd, timeout)
    return res.exit_code, res.output


# --------------------------------------------------------------------------
# Self-check: kTLS really works in the guest
# --------------------------------------------------------------------------

# Runs in the guest. Sets the TLS ULP on both ends of a loopback TCP pair
# (the proof the tls module is live), then, with a made-up TLS 1.2
# AES-128-GCM key (no handshake needed), checks one record end to end:
# the kernel encrypts on TX, the peer sees a framed ciphertext, and the same
# record sent back is authenticated and decrypted by kTLS RX.
CHECK_SCRIPT = r"""
import os, socket, struct
TCP_ULP, SOL_TLS, TLS_TX, TLS_RX = 31, 282, 1, 2
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
cli = socket.create_connection(srv.getsockname()); peer, _ = srv.accept()
for name, s in (("client", cli), ("server", peer)):
    s.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
    ulp = s.getsockopt(socket.IPPROTO_TCP, TCP_ULP, 16).rstrip(b"\0")
    print(f"TCP_ULP tls on {name}: ok (getsockopt -> {ulp.decode()})")
info = struct.pack("=HH8s16s4s8s", 0x0303, 51, bytes(8),
                   os.urandom(16), os.urandom(4), bytes(8))
cli.setsockopt(SOL_TLS, TLS_TX, info)
cli.setsockopt(SOL_TLS, TLS_RX, info)
msg = b"kTLS round trip"
cli.sendall(msg)
rec = peer.recv(4096)
assert rec[:3] == b"\x17\x03\x03", rec[:5]
assert struct.unpack(">H", rec[3:5])[0] == 8 + len(msg) + 16 == len(rec) - 5
assert msg not in rec
print(f"kTLS TX: {len(msg)} B -> {len(rec)} B TLS 1.2 AES-128-GCM record")
peer.sendall(rec)
back = cli.recv(4096)
assert back == msg, back
print("kTLS RX: record authenticated and decrypted by the kernel")
print("".join(l for l in open("/proc/net/tls_stat") if "Sw " in l), end="")
print("KTLS_CHECK_OK")
"""


def check(timeout: float = 600) -> int:
    """Boot the VM, prove kTLS works there, print timings; return exit code."""
    ver, image = find_kernel()
    print(f"kernel: {image} ({ver}, CONFIG_TLS=m)")
    with tempfile.TemporaryDirectory(prefix="ktls_check_") as tmp:
        probe = Path(tmp) / "ktls_check.py"
        probe.write_text(CHECK_SCRIPT)
        cmd = (
            "uname -r; lsmod | grep -w '^tls' || echo 'tls not loaded';"
            ' python3 -c "import sys, sendstream;'
            ' print(sys.executable, sendstream.__file__)"'
            f" && python3 {shlex.quote(str(probe))}"
        )
        res = run_in_vm_result(cmd, Path.cwd(), timeout, kernel=image, rwdirs=[Path(tmp)], echo=True)
    boot = f"{res.boot_seconds:.1f}" if res.boot_seconds else "?"
    up = f"{res.guest_uptime:.1f}" if res.guest_uptime else "?"
    print(f"boot to command: {boot} s (guest uptime {up} s); total {res.total_seconds:.1f} s")
    ok = res.exit_code == 0 and "KTLS_CHECK_OK" in res.output
    print("RESULT:", "kTLS works in the VM" if ok else f"FAILED (exit {res.exit_code})")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ensure", help="install qemu, the Debian kernel, virtme-ng")
    sub.add_parser("missing", help="print what ensure would install, one a line (nothing when ready)")
    p_check = sub.add_parser("check", help="boot the VM and verify kTLS")
    p_check.add_argument("--timeout", type=float, default=600)
    p_run = sub.add_parser("run", help="run a command in the VM")
    p_run.add_argument("--timeout", type=float, default=600)
    p_run.add_argument("--cwd", type=Path, default=Path.cwd())
    p_run.add_argument("--memory", default=DEFAULT_MEMORY)
    p_run.add_argument(
        "--rwdir", type=Path, action="append", default=[], help="host dir shared read-write (repeatable)"
    )
    p_run.add_argument(
        "--overlay-rwdir", type=Path, action="append", default=[], help="host dir writable in the guest only"
    )
    p_run.add_argument("command", nargs=argparse.REMAINDER, help="command and args (after --); one arg = shell string")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "ensure":
            ver, image = ensure()
            print(f"ready: {image} ({ver}), vng at {find_vng()}")
            return 0
        if args.cmd == "missing":
            print(*missing(), sep="\n")
            return 0
        if args.cmd == "check":
            ensure()
            return check(args.timeout)
        words = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not words:
            ap.error("run: give a command after --")
        command = words[0] if len(words) == 1 else shlex.join(words)
        ensure()
        res = run_in_vm_result(
            command,
            args.cwd,
            args.timeout,
            memory=args.memory,
            rwdirs=args.rwdir,
            overlay_rwdirs=args.overlay_rwdir,
            echo=True,
        )
        if not res.status_reported:
            sys.stdout.write(res.output.splitlines(True)[-1])
        boot = f"{res.boot_seconds:.1f}" if res.boot_seconds else "?"
        print(f"ktls_vm: exit {res.exit_code}; boot {boot} s, total {res.total_seconds:.1f} s", file=sys.stderr)
        return res.exit_code
    except KtlsVmError as exc:
        print(f"ktls_vm: {exc}", file=sys.stderr)
        return EXIT_HARNESS


if __name__ == "__main__":
    sys.exit(main())
