"""What the service's running transfers make, held so that no two make the same: a subvolume UUID, a
subvolume's or journal's path."""

from __future__ import annotations

import os
import threading
import uuid

from .. import errors as e
from .config import Client


class Claims:
    """Every claim of every running transfer, each made through a :class:`Held` of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[str, str] = {}  # claim: the client that holds it

    def holding(self, client: Client) -> Held:
        """The claims of one transfer (or sweep) of ``client``, none yet."""
        return Held(self, client)

    def _take(self, wanted: list[str], client: Client) -> None:
        with self._lock:
            for claim in wanted:
                if claim in self._claims:
                    raise e.SessionError(f"refused: another transfer is receiving {claim.split(' ', 1)[1]} now")
            for claim in wanted:
                self._claims[claim] = client.identity

    def _give_back(self, claims: list[str]) -> None:
        with self._lock:
            for claim in claims:
                del self._claims[claim]


class Held:
    """What one transfer of ``client`` holds; :meth:`release` lets it all go."""

    def __init__(self, claims: Claims, client: Client) -> None:
        self._claims = claims
        self.client = client
        self._held: list[str] = []

    def path(self, path: str) -> None:
        """Hold ``path`` (a journal's), or be refused when another transfer holds it."""
        self._hold([f"path {path}"])

    def subvolume(self, subvolume: uuid.UUID, name: str) -> None:
        """Hold ``subvolume`` (everywhere) and ``name`` (in the client's place)."""
        place = self.client.place
        if os.path.lexists(os.path.join(place, name)):
            raise e.SessionError(f"refused: '{e.escaped(name)}' is already in {self.client.identity}'s place")
        self._hold([f"uuid {subvolume}", f"path {os.path.join(place, name)}"])

    def _hold(self, wanted: list[str]) -> None:
        self._claims._take(wanted, self.client)
        self._held += wanted

    def release(self) -> None:
        self._claims._give_back(self._held)
        self._held = []
