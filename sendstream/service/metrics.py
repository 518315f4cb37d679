"""The service's metrics for Prometheus (``serve --metrics ADDR``), with ``prometheus_client``.

- ``sendstream_transfers_total{client,result}``: transfers that ended (``ok``, ``failed``), and
  connections refused after the handshake (``busy``);
- ``sendstream_received_bytes_total{client}``: stream bytes checked and stored or received;
- ``sendstream_active_transfers{client}``: transfers running now;
- ``sendstream_last_success_timestamp_seconds{client,subvolume}``: when the last transfer of that
  subvolume ended well. ``subvolume`` is the snapshot's name without a trailing date or number
  (``home.20261201T0100`` and ``home.20261202T0100`` are ``home``, as btrbk names them), so the
  number of series stays that of the subvolumes backed up, not of the snapshots. A name that is not
  printable UTF-8 is escaped as messages escape it (``caf\\xe9``).
"""

from __future__ import annotations

import re
import time
from typing import Any

from ..errors import UsageError, escaped
from ..transport.address import Address, cannot_listen

_SUFFIX = re.compile(r"[._-]?\d{4,}(?:[T_-]?\d+)*(?:_\d+)?$")


def series(name: str) -> str:
    """The subvolume a snapshot named ``name`` is of: the name without a trailing date or number, escaped
    (a label is UTF-8 text; a name may be any bytes but NUL and ``/``)."""
    return escaped(_SUFFIX.sub("", name) or name)


class Metrics:
    """The counters and gauges of one service; :meth:`serve` exposes them over HTTP."""

    def __init__(self) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise UsageError("--metrics needs prometheus_client: pip install 'sendstream[serve]'") from None
        self._prom = prom
        self.registry = prom.CollectorRegistry()
        self.transfers = prom.Counter(
            "sendstream_transfers", "Transfers that ended, by client and result.", ["client", "result"],
            registry=self.registry,
        )  # fmt: skip
        self.bytes = prom.Counter(
            "sendstream_received_bytes", "Stream bytes checked and stored or received, by client.", ["client"],
            registry=self.registry,
        )  # fmt: skip
        self.active = prom.Gauge(
            "sendstream_active_transfers", "Transfers running now, by client.", ["client"], registry=self.registry
        )
        self.last = prom.Gauge(
            "sendstream_last_success_timestamp_seconds",
            "When the last transfer of a subvolume ended well (Unix time), by client and subvolume.",
            ["client", "subvolume"],
            registry=self.registry,
        )
        self._server: Any = None

    def serve(self, address: Address) -> int:
        """Answer scrapes on ``address`` in a thread; the port (for a port 0)."""
        try:
            self._server, _ = self._prom.start_http_server(address.port, addr=address.host, registry=self.registry)
        except OSError as exc:
            raise cannot_listen(address.host, address.port, exc, "listening for metrics") from None
        return int(self._server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def began(self, client: str) -> None:
        self.active.labels(client).inc()

    def ended(self, client: str, result: str, size: int = 0, names: tuple[str, ...] = ()) -> None:
        self.active.labels(client).dec()
        self.transfers.labels(client, result).inc()
        if result == "ok":
            self.bytes.labels(client).inc(size)
            for name in names:
                self.last.labels(client, series(name)).set(time.time())

    def refused(self, client: str, result: str) -> None:
        self.transfers.labels(client, result).inc()


class NoMetrics:
    """What the service counts when nobody scrapes: nothing."""

    def began(self, client: str) -> None:
        pass

    def ended(self, client: str, result: str, size: int = 0, names: tuple[str, ...] = ()) -> None:
        pass

    def refused(self, client: str, result: str) -> None:
        pass

    def close(self) -> None:
        pass
