"""A fault-injecting TCP proxy: connections cut at chosen byte positions or stalled, for resumable transfers."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import struct
import threading
import time
from typing import Any

# A receiver and a sender that resume quickly across the proxy's cuts, and the seed of the cuts.
RECEIVER = ["--reconnect-timeout", "4", "--timeout", "5"]
SENDER = ["--retries", "8", "--retry-delay", "0.05", "--timeout", "1.5"]
SEED = int(os.environ.get("SENDSTREAM_FAULT_SEED", "20261130"))


class Proxy:
    """Forwards 127.0.0.1:port to the target; connection i suffers ``faults[i]`` (then none).

    ``rate`` (bytes per second) slows the sender's direction, as a slow network.
    """

    def __init__(self, target: int, faults: list[tuple[Any, ...]], rate: float | None = None) -> None:
        self.target = target
        self.faults = list(faults)
        self.rate = rate
        self.cuts = 0
        self.stalls = 0
        self.connections = 0
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self._stop = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target))
        except OSError:  # the target is not listening yet: this connection does not use up a fault
            client.close()
            return
        with self._lock:
            fault = self.faults.pop(0) if self.faults else ("none",)
        state = {"cut": False, "c2s": 0, "s2c_chunks": 0}
        gate = threading.Event()
        gate.set()

        def cut(rst: bool) -> None:
            with self._lock:
                if state["cut"]:
                    return
                state["cut"] = True
                self.cuts += 1
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    if rst:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()

        kind = fault[0]

        def c2s() -> None:
            limit = fault[1] if kind in ("c2s", "stall") else None
            size = 65536 if self.rate is None else max(1024, int(self.rate / 20))
            while not state["cut"]:
                if self.rate is not None:
                    time.sleep(size / self.rate)
                try:
                    chunk = client.recv(size)
                except OSError:
                    break
                if not chunk:
                    with contextlib.suppress(OSError):
                        upstream.shutdown(socket.SHUT_WR)
                    return
                if limit is not None and state["c2s"] + len(chunk) >= limit:
                    head = chunk[: limit - state["c2s"]]
                    with contextlib.suppress(OSError):
                        upstream.sendall(head)
                    state["c2s"] += len(head)
                    if kind == "c2s":
                        cut(fault[2])
                        return
                    # a stall: nothing moves either way for a while, then it goes on or is cut
                    gate.clear()
                    with self._lock:
                        self.stalls += 1
                    time.sleep(fault[2])
                    if fault[3]:
                        cut(True)
                        return
                    gate.set()
                    chunk = chunk[len(head) :]
                    limit = None
                gate.wait()
                try:
                    upstream.sendall(chunk)
                except OSError:
                    break
                state["c2s"] += len(chunk)
            cut(False)

        def s2c() -> None:
            while not state["cut"]:
                try:
                    chunk = upstream.recv(65536)
                except OSError:
                    break
                gate.wait()
                if not chunk:
                    with contextlib.suppress(OSError):
                        client.shutdown(socket.SHUT_WR)
                    return
                try:
                    client.sendall(chunk)
                except OSError:
                    break
                state["s2c_chunks"] += 1
                if kind == "s2c" and state["s2c_chunks"] >= fault[1]:
                    cut(fault[2])
                    return
            cut(False)

        threads = [threading.Thread(target=c2s, daemon=True), threading.Thread(target=s2c, daemon=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.close()


def plan(rng: random.Random, n: int, mode: str) -> list[tuple[Any, ...]]:
    faults: list[tuple[Any, ...]] = []
    for _ in range(n):
        r = rng.random()
        rst = rng.random() < 0.5
        if r < 0.25:  # inside the TLS handshake, or the session hello
            faults.append(("c2s", rng.randrange(1, 1200 if mode != "none" else 400), rst))
        elif r < 0.7:  # inside the stream: almost always inside a command
            faults.append(("c2s", rng.randrange(1200, 120_000), rst))
        elif r < 0.92:  # right after something from the receiver (the hello answer, an ack, the status)
            faults.append(("s2c", rng.randrange(1, 5), rst))
        else:  # a stall, short (goes on) or long (cut once the sender gave up on it)
            faults.append(("stall", rng.randrange(1, 100_000), rng.choice([0.3, 2.5]), rng.random() < 0.5))
    return faults
