#!/usr/bin/env python3
"""Benchmark ``sendstream send | receive`` over loopback against ssh and stunnel pipelines.

Usage: ``python3 tools/bench_transport.py [--stream FILE] [--repeat N] [--quick]``

Rows, measured in the same run, rounds interleaved, best wall time of ``--repeat``:

- ``sendstream send FILE`` -> ``sendstream receive -o /dev/null`` for every TLS
  mode this system offers (``none`` is raw TCP); the receiver checks every
  command before writing it (send -> receive -> verify).  Both run with ``-v``
  (the TLS path each direction took is reported) and their summaries must
  count every byte of the stream.
- the same with ``sendstream relay`` in the middle (send -> relay -> receive),
  in ``tls13-aes128-gcm`` and ``none``: the same mode on both legs, another key
  on each, so the relay decrypts, checks every command and encrypts again; its
  throughput against the direct row of the same mode (target: within 25%).
- reference *ssh*: ``cat FILE | ssh -c aes128-gcm@openssh.com root@127.0.0.1
  'btrfs receive --dump > /dev/null'`` against a private ``sshd`` started here
  (own config, host key, client key and port on 127.0.0.1; stopped at the end).
- reference *stunnel*: ``socat -u FILE TCP:P1`` -> stunnel PSK client -> stunnel
  PSK server -> ``socat -u TCP-LISTEN:P3 - | btrfs receive --dump > /dev/null``
  (TLS 1.3 AES-128-GCM); one more row ends in ``> /dev/null`` (transport only).

CPU seconds per GiB are ``ru_utime + ru_stime`` from ``os.wait4`` of each process,
summed per side (the child's value includes its reaped descendants); for the
daemon ``sshd`` the receiving side is the growth of its reaped children's times
(``cutime + cstime`` in ``/proc/PID/stat``).  Process start-up is included.
Progress goes to stderr, the report (markdown) to stdout.  Exits 1 on failure.
Standard library only; needs root (sshd, apt-get for missing tools).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import pathlib
import platform
import re
import resource
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from support.net import listening

TOOLS_DIR = pathlib.Path(__file__).resolve().parent
REPO = TOOLS_DIR.parent
BENCH_DIR = pathlib.Path("/var/tmp/sendstream-bench")
DEFAULT_STREAM = BENCH_DIR / "bigwrite.stream"
QUICK_STREAM = BENCH_DIR / "metadata.stream"
TLS13_MODE = "tls13-aes128-gcm"
RELAY_MODES = (TLS13_MODE, "none")  # each also measured as send -> relay -> receive
RELAY_TARGET = 0.75  # the relay's throughput against the direct transfer in the same mode
SSH_CIPHER = "aes128-gcm@openssh.com"
STUNNEL_SUITE = "TLS_AES_128_GCM_SHA256"
SSH_LABEL = "cat -> ssh aes128-gcm -> btrfs receive --dump"
STUNNEL_LABEL = "socat -> stunnel PSK -> socat -> btrfs receive --dump"
STUNNEL_NULL_LABEL = "socat -> stunnel PSK -> socat > /dev/null"
GIB = 2**30
CLK_TCK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT = 20.0
RUN_TIMEOUT = 900.0
PACKAGES = {"sshd": "openssh-server", "ssh": "openssh-client", "stunnel4": "stunnel4", "socat": "socat"}


class BenchError(Exception):
    """A measured command failed, a tool is missing, or a server did not start."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One finished transfer: wall seconds and CPU seconds of each side."""

    seconds: float
    send_cpu: float
    recv_cpu: float
    relay_cpu: float = 0.0


@dataclasses.dataclass
class Row:
    """All runs of one pipeline; ``note`` says what was negotiated."""

    label: str
    kind: str
    runs: list[Run] = dataclasses.field(default_factory=list)
    note: str = ""

    @property
    def best(self) -> Run:
        """The run with the shortest wall time."""
        return min(self.runs, key=lambda r: r.seconds)


def log(msg: str) -> None:
    """Progress message on stderr."""
    print(msg, file=sys.stderr, flush=True)


def cpu_of(usage: resource.struct_rusage) -> float:
    """User + system seconds of a ``resource.struct_rusage``."""
    return usage.ru_utime + usage.ru_stime


def find_exe(name: str, sbin: bool = False) -> str:
    """Absolute path of *name*, preferring this interpreter's scripts dir (skips pyenv shims)."""
    dirs = [sysconfig.get_path("scripts"), os.environ.get("PATH", os.defpath)]
    if sbin:
        dirs.append("/usr/sbin:/sbin")
    path = shutil.which(name, path=os.pathsep.join(dirs))
    if path is None:
        raise BenchError(f"{name} not found in PATH")
    return os.path.abspath(path)


def ensure_tools() -> None:
    """Install the Debian packages of missing reference tools (sshd, ssh, stunnel4, socat)."""
    missing = []
    for exe, pkg in PACKAGES.items():
        try:
            find_exe(exe, sbin=True)
        except BenchError:
            missing.append(pkg)
    if not missing:
        return
    log(f"$ apt-get install -y {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(["apt-get", "install", "-y", *missing], stdout=sys.stderr, stderr=sys.stderr, env=env)
    if proc.returncode != 0:
        raise BenchError(f"apt-get install {' '.join(missing)} failed (exit {proc.returncode})")


def bench_env() -> dict[str, str]:
    """Children's environment: this checkout's package first on the path; C locale."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, LC_ALL="C")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, procs: Sequence[subprocess.Popen[bytes]], what: str) -> None:
    """Wait until *port* listens; raise if a process of *procs* exits first or it takes too long."""
    deadline = time.monotonic() + START_TIMEOUT
    while not listening(port):
        for p in procs:
            if p.poll() is not None:
                raise BenchError(f"{what} exited (status {p.returncode}) before listening on port {port}")
        if time.monotonic() > deadline:
            raise BenchError(f"{what} did not listen on port {port} within {START_TIMEOUT:.0f} s")
        time.sleep(0.01)


def reap(proc: subprocess.Popen[bytes], timeout: float = RUN_TIMEOUT) -> tuple[int, float]:
    """``os.wait4`` *proc* (killing it after *timeout*): exit code and CPU seconds."""
    code, usage = reap_usage(proc, timeout)
    return code, cpu_of(usage)


def reap_usage(proc: subprocess.Popen[bytes], timeout: float = RUN_TIMEOUT) -> tuple[int, resource.struct_rusage]:
    """``os.wait4`` *proc* (killing it after *timeout*): exit code and resource usage."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = code = os.waitstatus_to_exitcode(status)
            return code, usage
        if time.monotonic() > deadline:
            proc.kill()
            deadline = time.monotonic() + 5
        time.sleep(0.002)


def stop(proc: subprocess.Popen[bytes]) -> float:
    """SIGTERM a server we started, reap it, return its CPU seconds."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        return reap(proc, timeout=10)[1]
    return 0.0


def check(codes: Sequence[tuple[str, int]], logs: Sequence[pathlib.Path] = ()) -> None:
    """Raise BenchError naming the first process that failed, with the tail of *logs*."""
    bad = [f"{name} (exit {code})" for name, code in codes if code != 0]
    if bad:
        tails = "".join(f"\n--- {p}:\n{p.read_text(errors='replace')[-2000:]}" for p in logs if p.exists())
        raise BenchError(f"failed: {', '.join(bad)}{tails}")


def proc_times(pid: int) -> tuple[float, float]:
    """(own utime+stime, reaped children's cutime+cstime) of *pid*, in seconds."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    # fields[0] is field 3 (state): utime=14, stime=15, cutime=16, cstime=17
    own = (int(fields[11]) + int(fields[12])) / CLK_TCK
    children = (int(fields[13]) + int(fields[14])) / CLK_TCK
    return own, children


def has_children(pid: int) -> bool:
    """Whether *pid* has any live (or unreaped) child."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            if pathlib.Path(f"/proc/{pid}/task/{task}/children").read_text().strip():
                return True
    return False


class Bench:
    """Temp directory, keys, servers and the pipelines to measure."""

    def __init__(self, tmp: pathlib.Path, stream: pathlib.Path) -> None:
        self.tmp = tmp
        self.stream = stream
        self.env = bench_env()
        self.sendstream = find_exe("sendstream")
        self.btrfs = find_exe("btrfs")
        self.cat = find_exe("cat")
        self.ssh = find_exe("ssh")
        self.sshd = find_exe("sshd", sbin=True)
        self.stunnel = find_exe("stunnel4") if shutil.which("stunnel4") else find_exe("stunnel")
        self.socat = find_exe("socat")
        self.key = tmp / "psk.key"
        self.key.write_bytes(secrets.token_bytes(32))
        self.key.chmod(0o600)
        self.relay_key = tmp / "relay.key"  # the relay's downstream leg: another key
        self.relay_key.write_bytes(secrets.token_bytes(32))
        self.relay_key.chmod(0o600)
        self.sshd_proc: subprocess.Popen[bytes] | None = None
        self.sshd_port = 0
        self.made_run_sshd = False

    # --- sendstream --------------------------------------------------------

    def run_sendstream(self, mode: str, relay: bool = False) -> tuple[Run, str]:
        """``sendstream send`` -> [``sendstream relay`` ->] ``sendstream receive -o /dev/null`` once; the run
        and the TLS paths. The relay runs *mode* on both legs with another key on each (re-encrypts)."""
        recv_port = free_port()
        relay_port = free_port() if relay else recv_port
        while relay and relay_port == recv_port:
            relay_port = free_port()
        downstream_key = self.relay_key if relay else self.key

        def tls(key: pathlib.Path, leg: str = "") -> list[str]:
            flag = f"--{leg}-" if leg else "--"
            return [f"{flag}tls", mode] + ([] if mode == "none" else [f"{flag}key", str(key)])

        # side, summary verb, argv, the port it listens on (0: none); no -q: the summaries' byte counts are checked
        receive = ["receive", "--listen", f"127.0.0.1:{recv_port}", "-o", "/dev/null", *tls(downstream_key)]
        sides = [("receive", "received", receive, recv_port)]
        if relay:
            legs = [*tls(self.key, "listen"), *tls(self.relay_key, "to")]
            forward = ["relay", "--listen", f"127.0.0.1:{relay_port}", "--to", f"127.0.0.1:{recv_port}", *legs]
            sides.append(("relay", "relayed", forward, relay_port))
        send = ["send", "--to", f"127.0.0.1:{relay_port}", str(self.stream), *tls(self.key)]
        sides.append(("send", "sent", send, 0))
        logs = [self.tmp / f"{side}.log" for side, *_ in sides]
        procs: list[subprocess.Popen[bytes]] = []
        t0 = 0.0  # the sender's start
        try:
            for (side, _, argv, port), path in zip(sides, logs, strict=True):
                if side == "send":
                    t0 = time.perf_counter()
                with open(path, "wb") as log_file:
                    procs.append(
                        subprocess.Popen(
                            [self.sendstream, *argv, "-v"],
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            stderr=log_file,
                            env=self.env,
                        )
                    )
                if port:
                    wait_listening(port, procs[-1:], f"sendstream {side}")
            results = [reap(proc) for proc in reversed(procs)][::-1]  # the sender ends first
            elapsed = time.perf_counter() - t0
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    reap(proc, 5)
        check([(f"sendstream {side}", code) for (side, *_), (code, _) in zip(sides, results, strict=True)], logs)
        size = self.stream.stat().st_size
        paths = []
        for (side, verb, *_), path in zip(sides, logs, strict=True):
            text = path.read_text(errors="replace")
            if f"sendstream: {verb} " not in text or f" ({size:,} bytes) in " not in text:
                raise BenchError(f"sendstream {side}: no '{verb} {size} bytes' summary:\n{text[-2000:]}")
            lines = [x for x in text.splitlines() if x.startswith("sendstream: ") and "warning" not in x]
            if lines:
                paths.append(f"{side}: {lines[0].removeprefix('sendstream: ')}")
        cpu = {side: used for (side, *_), (_, used) in zip(sides, results, strict=True)}
        return Run(elapsed, cpu["send"], cpu["receive"], cpu.get("relay", 0.0)), "; ".join(paths)

    # --- ssh ---------------------------------------------------------------

    def start_sshd(self) -> None:
        """Start a private sshd on 127.0.0.1 with its own host key, client key and config."""
        d = self.tmp / "ssh"
        d.mkdir(mode=0o700)
        for name in ("host", "client"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"bench-{name}", "-f", str(d / name)],
                check=True,
                stdin=subprocess.DEVNULL,
            )
        (d / "authorized_keys").write_bytes((d / "client.pub").read_bytes())
        self.sshd_port = free_port()
        config = d / "sshd_config"
        config.write_text(
            f"ListenAddress 127.0.0.1:{self.sshd_port}\n"
            f"HostKey {d / 'host'}\n"
            f"PidFile {d / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\n"
            "PermitRootLogin yes\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n"
            f"Ciphers {SSH_CIPHER}\nX11Forwarding no\nPrintMotd no\nLogLevel ERROR\n"
        )
        if not os.path.isdir("/run/sshd"):  # privilege separation directory, compiled into sshd
            os.makedirs("/run/sshd", mode=0o755)
            self.made_run_sshd = True
        argv = [self.sshd, "-D", "-f", str(config), "-p", str(self.sshd_port), "-E", str(d / "sshd.log")]
        self.sshd_proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=self.env)
        wait_listening(self.sshd_port, [self.sshd_proc], "sshd")

    def stop_sshd(self) -> None:
        """Stop the sshd started here (only that one) and remove what was made for it."""
        if self.sshd_proc is not None:
            stop(self.sshd_proc)
            self.sshd_proc = None
        if self.made_run_sshd:
            with contextlib.suppress(OSError):
                os.rmdir("/run/sshd")

    def ssh_argv(self, command: str) -> list[str]:
        """The ssh client command line running *command* on the private sshd."""
        d = self.tmp / "ssh"
        opts = ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", f"Ciphers={SSH_CIPHER}"]
        opts += ["BatchMode=yes", "LogLevel=ERROR", "Compression=no"]
        args = [self.ssh, "-F", "/dev/null", "-c", SSH_CIPHER, "-p", str(self.sshd_port), "-i", str(d / "client")]
        for o in opts:
            args += ["-o", o]
        return [*args, "root@127.0.0.1", command]

    def run_ssh(self) -> Run:
        """``cat FILE | ssh ... 'btrfs receive --dump > /dev/null'`` once."""
        assert self.sshd_proc is not None
        pid = self.sshd_proc.pid
        cmd = f"{shlex.quote(self.btrfs)} receive --dump > /dev/null"
        ssh_log = self.tmp / "ssh.log"
        own0, children0 = proc_times(pid)
        with open(ssh_log, "wb") as sl:
            t0 = time.perf_counter()
            cat = subprocess.Popen([self.cat, str(self.stream)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
            assert cat.stdout is not None
            ssh = subprocess.Popen(self.ssh_argv(cmd), stdin=cat.stdout, stdout=subprocess.DEVNULL, stderr=sl)
            cat.stdout.close()
            ssh_code, ssh_cpu = reap(ssh)
            elapsed = time.perf_counter() - t0
            cat_code, cat_cpu = reap(cat)
        deadline = time.monotonic() + 10
        while has_children(pid) and time.monotonic() < deadline:  # sshd reaps the session after the client ends
            time.sleep(0.005)
        own1, children1 = proc_times(pid)
        check([("cat", cat_code), ("ssh", ssh_code)], [ssh_log, self.tmp / "ssh" / "sshd.log"])
        return Run(elapsed, cat_cpu + ssh_cpu, (own1 - own0) + (children1 - children0))

    # --- stunnel -----------------------------------------------------------

    def stunnel_conf(self, name: str, accept: int, connect: int, client: bool) -> pathlib.Path:
        """A foreground stunnel config: PSK, TLS 1.3, AES-128-GCM, logging to a file."""
        d = self.tmp / "stunnel"
        d.mkdir(mode=0o700, exist_ok=True)
        secrets_file = d / "psk.txt"
        if not secrets_file.exists():
            secrets_file.write_text(f"bench:{secrets.token_hex(32)}\n")
            secrets_file.chmod(0o600)
        conf = d / f"{name}.conf"
        conf.write_text(
            f"foreground = yes\npid =\noutput = {d / name}.log\ndebug = info\n\n[{name}]\n"
            f"client = {'yes' if client else 'no'}\naccept = 127.0.0.1:{accept}\nconnect = 127.0.0.1:{connect}\n"
            f"PSKsecrets = {secrets_file}\n{'PSKidentity = bench' + chr(10) if client else ''}"
            f"sslVersionMin = TLSv1.3\nsslVersionMax = TLSv1.3\nciphersuites = {STUNNEL_SUITE}\n"
        )
        return conf

    def run_stunnel(self, dump: bool) -> tuple[Run, str]:
        """socat -> stunnel client -> stunnel server -> socat (-> ``btrfs receive --dump`` if *dump*) once."""
        p1, p2, p3 = free_port(), free_port(), free_port()
        while len({p1, p2, p3}) < 3:
            p2, p3 = free_port(), free_port()
        d = self.tmp / "stunnel"
        server_conf = self.stunnel_conf("server", p2, p3, client=False)
        client_conf = self.stunnel_conf("client", p1, p2, client=True)
        for name in ("server", "client"):
            (d / f"{name}.log").unlink(missing_ok=True)
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        procs: list[subprocess.Popen[bytes]] = []
        try:
            server = subprocess.Popen([self.stunnel, str(server_conf)], **quiet)  # type: ignore[call-overload]
            procs.append(server)
            client = subprocess.Popen([self.stunnel, str(client_conf)], **quiet)  # type: ignore[call-overload]
            procs.append(client)
            sink = [self.socat, "-u", f"TCP-LISTEN:{p3},bind=127.0.0.1,reuseaddr", "STDOUT"]
            if dump:
                listener = subprocess.Popen(sink, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
                procs.append(listener)
                assert listener.stdout is not None
                btrfs = subprocess.Popen(
                    [self.btrfs, "receive", "--dump"], stdin=listener.stdout, stdout=subprocess.DEVNULL
                )
                procs.append(btrfs)
                listener.stdout.close()
            else:
                listener = subprocess.Popen(sink, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
                procs.append(listener)
            wait_listening(p2, [server], "stunnel server")
            wait_listening(p1, [client], "stunnel client")
            wait_listening(p3, [listener], "socat listener")
            t0 = time.perf_counter()
            source = subprocess.Popen([self.socat, "-u", str(self.stream), f"TCP:127.0.0.1:{p1}"], **quiet)  # type: ignore[call-overload]
            procs.append(source)
            source_code, source_cpu = reap(source)
            listener_code, listener_cpu = reap(listener)
            codes = [("socat source", source_code), ("socat listener", listener_code)]
            recv_cpu = listener_cpu
            if dump:
                btrfs_code, btrfs_cpu = reap(btrfs)
                codes.append(("btrfs receive --dump", btrfs_code))
                recv_cpu += btrfs_cpu
            elapsed = time.perf_counter() - t0
            client_cpu, server_cpu = stop(client), stop(server)
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    reap(p, 5)
        check(codes, [d / "client.log", d / "server.log"])
        text = (d / "client.log").read_text(errors="replace")
        m = re.search(r"(TLSv[\d.]+) ciphersuite: (\S+)", text)
        note = f"{m.group(1)} {m.group(2)}" if m else "negotiated cipher not logged"
        return Run(elapsed, source_cpu + client_cpu, recv_cpu + server_cpu), note


def warm(path: pathlib.Path) -> None:
    """Read *path* once so every run starts from the page cache."""
    buf = bytearray(1 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def available_modes() -> tuple[list[str], dict[str, str]]:
    """TLS modes usable here, and why the others are not (``sendstream.transport.tls.why_unavailable``)."""
    sys.path.insert(0, str(REPO))
    from sendstream.transport.tls import MODES, why_unavailable

    ok, skipped = [], {}
    for mode in MODES:
        reason = why_unavailable(mode)
        if reason is None:
            ok.append(mode)
        else:
            skipped[mode] = reason
    return ok, skipped


def version_of(argv: list[str], want: str = "") -> str:
    """First line of a command's output (``--version``) containing *want*, ``?`` if none."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    lines = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if want in line and line.strip()]
    return lines[0] if lines else "?"


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    return platform.processor() or "unknown"


def checkout() -> str:
    """This checkout's commit, noting uncommitted changes to the package."""
    head = version_of(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--", "sendstream"], capture_output=True, text=True
    ).stdout.strip()
    return head + (" + uncommitted changes in sendstream/" if dirty else "")


def ratio(ref: float, ours: float) -> str:
    """``ref / ours`` (> 1: *ours* is faster), two decimals."""
    return f"{ref / ours:.2f}" if ours > 0 else "-"


def report(rows: list[Row], bench: Bench, skipped: dict[str, str], repeat: int, started: str, took: float) -> str:
    """The markdown report: machine info, table, targets."""
    size = bench.stream.stat().st_size
    gib = size / GIB
    by_label = {r.label: r for r in rows}
    t_ssh, t_stunnel = by_label[SSH_LABEL].best.seconds, by_label[STUNNEL_LABEL].best.seconds
    t_null = by_label[STUNNEL_NULL_LABEL].best.seconds
    out = [
        f"## sendstream transport benchmark, {started}",
        "",
        f"- machine: {len(os.sched_getaffinity(0))} CPUs (nproc), {cpu_model()}",
        f"- kernel: {platform.system()} {platform.release()}; Python {platform.python_version()}",
        f"- sendstream: {bench.sendstream}; checkout {checkout()}",
        f"- {version_of([bench.ssh, '-V'])}; {version_of([bench.stunnel, '-version'], 'stunnel ')}; "
        f"{version_of([bench.socat, '-V'], 'socat version')}",
        f"- {version_of([bench.btrfs, '--version'])}",
        f"- stream: {bench.stream} ({size:,} bytes, {gib:.2f} GiB), page cache warm; loopback 127.0.0.1",
        f"- best of {repeat} runs (rounds interleaved); whole benchmark took {took:.0f} s",
        "- wall time: from starting the sender until both sides exited (servers already listening)",
        "- CPU s/GiB: user+system seconds per GiB of stream, from `os.wait4` of each process (with its reaped"
        " children), summed per side, process start-up included; sshd side = growth of the private sshd's reaped"
        " children (`cutime+cstime`)",
        "- send side: `sendstream send` | `cat` + `ssh` | `socat` + stunnel client; receive side: `sendstream"
        " receive` (verifies every command) | sshd + bash + `btrfs receive --dump` | stunnel server + `socat`"
        " (+ `btrfs receive --dump`)",
        "- MB = 1e6 bytes; ratios are reference_time / row_time (> 1: this row is faster)",
    ]
    for mode, why in skipped.items():
        out.append(f"- skipped `{mode}`: {why}")
    out += [
        "",
        "| pipeline | seconds | MB/s | send CPU s/GiB | receive CPU s/GiB | relay CPU s/GiB"
        " | vs ssh | vs stunnel | vs stunnel > /dev/null |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        b = r.best
        relay_cpu = f"{b.relay_cpu / gib:.2f}" if r.kind.startswith("relay ") else "-"
        out.append(
            f"| {r.label} | {b.seconds:.3f} | {size / b.seconds / 1e6:,.1f} | {b.send_cpu / gib:.2f} "
            f"| {b.recv_cpu / gib:.2f} | {relay_cpu} | {ratio(t_ssh, b.seconds)} | {ratio(t_stunnel, b.seconds)} "
            f"| {ratio(t_null, b.seconds)} |"
        )
    out += ["", "Negotiated:"]
    out += [f"- {r.label}: {r.note}" for r in rows if r.note]
    out += ["", "Targets (from the issue):"]
    tls13 = by_label.get(f"sendstream --tls {TLS13_MODE}")
    if tls13:
        t = tls13.best.seconds
        out.append(
            f"- TLS 1.3 >= stunnel pipeline: {ratio(t_stunnel, t)}x -> {'met' if t <= t_stunnel else 'NOT met'}"
            f" (vs stunnel > /dev/null: {ratio(t_null, t)}x -> {'met' if t <= t_null else 'NOT met'})"
        )
        out.append(f"- TLS 1.3 >= 2x ssh pipeline: {ratio(t_ssh, t)}x -> {'met' if 2 * t <= t_ssh else 'NOT met'}")
    raw = by_label.get("sendstream --tls none")
    if raw:
        rate = size / raw.best.seconds / 1e9
        out.append(f"- raw TCP (`--tls none`) >= 1 GB/s: {rate:.2f} GB/s -> {'met' if rate >= 1 else 'NOT met'}")
    for mode in RELAY_MODES:
        relayed, direct = by_label.get(relay_label(mode)), by_label.get(f"sendstream --tls {mode}")
        if relayed and direct:
            share = direct.best.seconds / relayed.best.seconds
            out.append(
                f"- relay within {1 - RELAY_TARGET:.0%} of direct (`--tls {mode}`): relay throughput {share:.2f}x"
                f" the direct one -> {'met' if share >= RELAY_TARGET else 'NOT met'}"
            )
    return "\n".join(out)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--stream", type=pathlib.Path, default=None, help=f"stream to send (default {DEFAULT_STREAM})")
    p.add_argument("--repeat", type=int, default=None, metavar="N", help="runs per pipeline, best kept (default 3)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_STREAM.name} and 1 run (smoke test)")
    args = p.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.stream is None:
        args.stream = QUICK_STREAM if args.quick else DEFAULT_STREAM
    return args


@contextlib.contextmanager
def bench_dir() -> Iterator[pathlib.Path]:
    """A private temp directory, removed at the end."""
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        os.chmod(tmp, 0o700)
        yield pathlib.Path(tmp)


def relay_label(mode: str) -> str:
    """The row of ``send -> relay -> receive`` in *mode* (both legs)."""
    return f"sendstream --tls {mode} -> relay -> receive"


def measure(bench: Bench, modes: list[str], repeat: int) -> list[Row]:
    """Run every pipeline *repeat* times, rounds interleaved."""
    rows = [Row(f"sendstream --tls {m}", m) for m in modes]
    rows += [Row(relay_label(m), f"relay {m}") for m in RELAY_MODES if m in modes]
    rows += [Row(SSH_LABEL, "ssh"), Row(STUNNEL_LABEL, "stunnel"), Row(STUNNEL_NULL_LABEL, "stunnel-null")]
    for rnd in range(1, repeat + 1):
        for row in rows:
            if row.kind == "ssh":
                run = bench.run_ssh()
            elif row.kind.startswith("stunnel"):
                run, row.note = bench.run_stunnel(dump=row.kind == "stunnel")
            else:
                run, row.note = bench.run_sendstream(row.kind.removeprefix("relay "), row.kind.startswith("relay "))
            row.runs.append(run)
            log(
                f"  [{rnd}/{repeat}] {row.label:<42} {run.seconds:8.3f} s"
                f"  send {run.send_cpu:6.2f} s  recv {run.recv_cpu:6.2f} s  relay {run.relay_cpu:6.2f} s CPU"
            )
    return rows


def main(argv: list[str]) -> int:
    """Run the benchmark; 0 on success, 1 on failure."""
    args = parse_args(argv)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    t_start = time.monotonic()
    stream: pathlib.Path = args.stream.resolve()
    if os.geteuid() != 0:
        print("bench_transport: needs root (private sshd as root, apt-get)", file=sys.stderr)
        return 1
    try:
        if not stream.is_file():
            raise BenchError(f"{stream} missing: run tools/make_bench_streams.py")
        ensure_tools()
        modes, skipped = available_modes()
        log(f"warming page cache: {stream}")
        warm(stream)
        with bench_dir() as tmp:
            bench = Bench(tmp, stream)
            try:
                bench.start_sshd()
                log(
                    f"private sshd pid {bench.sshd_proc.pid if bench.sshd_proc else '?'} on 127.0.0.1:{bench.sshd_port}"
                )
                rows = measure(bench, modes, args.repeat)
            finally:
                bench.stop_sshd()
            text = report(rows, bench, skipped, args.repeat, started, time.monotonic() - t_start)
    except (BenchError, subprocess.CalledProcessError, OSError) as exc:
        print(f"bench_transport: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
