"""The state of a resumable upload: a small object ``NAME.upload`` beside the stream, authenticated.

It holds the multipart upload's ID, the objects already completed, the
parts completed in order (number, ETag, size), how they are sealed (the
cipher and the key's fingerprint, or nothing) and the checkpoint where the
last of them ends: the stream's identity, the offset, the number of
commands before it and the ledger there (:mod:`sendstream.transfer.ledger`). A
run of ``send --to s3:// --resumable`` reads the same stream again, checks
it against that ledger, uploads only the parts after it, and completes the
same upload. It is signed with HMAC-SHA-256 under a key derived from the
pre-shared key (``--key``), as resume tokens are, so that nobody who can
write to the bucket but lacks the key can make a run skip what it did not
upload.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from .. import errors as e
from ..transfer.identity import Identity, check_identity, checked_integer, load_json, printable
from ..transfer.ledger import Checkpoint
from .store import BucketClient, Location, calling, missing

STATE_SUFFIX = ".upload"
STATE_FORMAT = "sendstream-upload-2"  # 1 did not say how its parts are sealed
MAX_STATE = 4 << 20
MAX_DEPTH = 5  # {"state": {"objects": [{"parts": [...]}]}}: the objects a sealed upload completed


@dataclass
class UploadState:
    """Where a resumable upload stands."""

    stream: Identity
    upload_id: str
    key: str  # of the object being uploaded, under the prefix
    objects: list[dict[str, Any]] = field(default_factory=list)  # completed before it: key, size
    parts: list[tuple[int, str, int]] = field(default_factory=list)  # number, ETag, size
    offset: int = 0
    commands: int = 0
    ledger: str = ""
    sealing: dict[str, Any] | None = None  # :attr:`~.seal.Sealer.description` of the parts' key; None: plain

    @property
    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.stream, self.offset, self.commands, self.ledger)

    def refuse_other_sealing(self, sealing: dict[str, Any] | None, location: Location, name: str) -> None:
        """Refuse to take this upload of ``name`` up with parts ``sealing`` otherwise than its own, saying
        what to do."""
        if sealing == self.sealing:
            return

        def said(how: dict[str, Any] | None) -> str:
            return f"sealed with key {how['key']} ({how['cipher']})" if how else "not encrypted"

        again = f"with --encrypt-key FILE of key {self.sealing['key']}" if self.sealing else "without --encrypt-key"
        url = location.url(name + STATE_SUFFIX)
        raise e.ResumeError(  # (escaped: what the state says may hold anything)
            printable(
                f"{url}: the earlier run's parts are {said(self.sealing)}, this run's would be {said(sealing)}: "
                f"run it again {again}; or start over: delete {url} and abort the multipart upload "
                f"{self.upload_id} of {location.url(self.key)}"
            )
        )


def _mac(key: bytes, payload: bytes) -> str:
    state_key = hmac.new(key, b"sendstream upload state 1", hashlib.sha256).digest()
    return hmac.new(state_key, payload, hashlib.sha256).hexdigest()


def save(s3: BucketClient, location: Location, name: str, state: UploadState, key: bytes) -> None:
    body = {
        "format": STATE_FORMAT,
        "stream": state.stream,
        "upload_id": state.upload_id,
        "key": state.key,
        "objects": state.objects,
        "parts": state.parts,
        "offset": state.offset,
        "commands": state.commands,
        "ledger": state.ledger,
        "sealing": state.sealing,
    }
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    with calling(location.url(name + STATE_SUFFIX)):
        s3.put_object(
            Bucket=location.bucket,
            Key=location.key(name + STATE_SUFFIX),
            Body=json.dumps({"state": body, "mac": _mac(key, payload)}).encode(),
        )


def load(s3: BucketClient, location: Location, name: str, key: bytes) -> UploadState | None:
    """The state of an earlier run of the upload of ``name``; None when there is none."""
    url = location.url(name + STATE_SUFFIX)
    try:
        with calling(url):
            body = s3.get_object(Bucket=location.bucket, Key=location.key(name + STATE_SUFFIX))["Body"]
            raw = body.read(MAX_STATE + 1)
    except e.StoreError as exc:
        if missing(exc):
            return None
        raise
    try:
        outer = load_json(raw[:MAX_STATE], "the upload state", MAX_DEPTH)
        fields = outer["state"]
        payload = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
        if not hmac.compare_digest(str(outer["mac"]), _mac(key, payload)):
            raise e.ResumeError(f"{url}: its signature does not match this key (--key): it was not made with it")
        if fields["format"] != STATE_FORMAT:
            raise ValueError(f"format {fields['format']!r}")
        parts = [
            (checked_integer(n, "part"), str(etag), checked_integer(size, "size")) for n, etag, size in fields["parts"]
        ]
        return UploadState(
            stream=check_identity(fields["stream"]),
            upload_id=str(fields["upload_id"]),
            key=str(fields["key"]),
            objects=[_object(o) for o in fields["objects"]],
            parts=parts,
            offset=checked_integer(fields["offset"], "offset"),
            commands=checked_integer(fields["commands"], "commands"),
            ledger=str(fields["ledger"]),
            sealing=_sealing(fields["sealing"]),
        )
    except (e.SessionError, KeyError, TypeError, ValueError) as exc:
        raise e.ResumeError(f"{url} is not an upload state of ours ({exc}): remove it to start over") from None


def _sealing(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    return {
        "cipher": str(value["cipher"]),
        "key": str(value["key"]),
        "segment": checked_integer(value["segment"], "segment"),
    }


def _object(o: Any) -> dict[str, Any]:
    done = {"key": str(o["key"]), "size": checked_integer(o["size"], "size")}
    if "parts" in o:
        done["parts"] = [checked_integer(size, "a part's size") for size in o["parts"]]
    return done


def forget(s3: BucketClient, location: Location, name: str) -> None:
    with calling(location.url(name + STATE_SUFFIX)):
        s3.delete_object(Bucket=location.bucket, Key=location.key(name + STATE_SUFFIX))
