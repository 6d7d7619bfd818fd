"""Refusals a command backend can prove: a refusal of one exact invocation
that ran nothing, signed with a key that never leaves the process."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any, Final, Protocol, final

from ..errors import Error, ErrorClass

__all__ = ["PROOF", "RefusalSigner", "unverified", "without_proof"]

#: The detail holding a refusal's proof.
PROOF: Final = "refusal_proof"


class _Invocation(Protocol):
    @property
    def owner(self) -> str: ...
    @property
    def session_id(self) -> int: ...
    @property
    def incarnation(self) -> int: ...


@final
class RefusalSigner:
    """Signs and verifies ``launch_status: never_started`` refusals."""

    __slots__ = ("_key",)

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def sign(self, invocation: _Invocation, error: Error, floor: int) -> Error:
        """``error`` as a proved refusal of ``invocation`` (nothing ran);
        ``floor``: the backend's expired-id floor as it refused."""
        details = {**without_proof(error).details, "launch_status": "never_started"}
        proved = Error(error.error_class, error.message, details)
        proof = f"{floor}:{self._mac(invocation, proved, floor)}"
        return Error(error.error_class, error.message, {**details, PROOF: proof})

    def verify(self, invocation: _Invocation, error: BaseException) -> int:
        """The floor a refusal this signer signed for ``invocation`` was
        signed with; ``unknown_outcome`` "command refusal is unverified" for
        any other error (another invocation's, another backend's, altered,
        or unsigned)."""
        if isinstance(error, Error) and error.details.get("launch_status") == "never_started":
            given = error.details.get(PROOF)
            floor, _, mac = given.partition(":") if isinstance(given, str) else ("", "", "")
            if floor.isascii() and floor.isdigit():
                expected = self._mac(invocation, without_proof(error), int(floor))
                if hmac.compare_digest(mac, expected):
                    return int(floor)
        raise unverified(invocation, error)

    def _mac(self, invocation: _Invocation, error: Error, floor: int) -> str:
        signed: list[Any] = [
            floor,
            invocation.owner,
            invocation.session_id,
            invocation.incarnation,
            error.error_class.value,
            error.message,
            dict(error.details),
        ]
        text = json.dumps(signed, sort_keys=True, default=repr, ensure_ascii=True)
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()


def unverified(invocation: _Invocation, error: BaseException) -> Error:
    """``unknown_outcome``: ``error`` does not show that nothing ran."""
    return Error(
        ErrorClass.UNKNOWN_OUTCOME,
        "command refusal is unverified",
        {"session_id": invocation.session_id, "refusal": str(error)[:300]},
    )


def without_proof(error: Error) -> Error:
    """``error`` without its proof (what a model or a log is shown)."""
    if PROOF not in error.details:
        return error
    details = {k: v for k, v in error.details.items() if k != PROOF}
    return Error(error.error_class, error.message, details)
