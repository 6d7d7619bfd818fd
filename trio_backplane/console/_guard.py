"""Who may read and answer: the console's token (or the host's hook), and
a CSRF token bound to the browser's session on every answer."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Any, Final

__all__ = ["AUTH_COOKIE", "SESSION_COOKIE", "Guard"]

AUTH_COOKIE: Final = "backplane_console"
SESSION_COOKIE: Final = "backplane_session"


class Guard:
    """``authenticate(request)`` names who is asking (``None``: nobody);
    the default accepts the console's ``token`` as a cookie (set by
    ``/login?token=...``) or an ``Authorization: Bearer`` header, compared
    in constant time."""

    def __init__(self, token: str, authenticate: Callable[[Any], str | None] | None) -> None:
        self.token = token
        self._authenticate = authenticate
        self._secret = secrets.token_bytes(32)  # CSRF tokens die with the console

    def who(self, request: Any) -> str | None:
        if self._authenticate is not None:
            return self._authenticate(request) or None  # "" names nobody
        offered = request.cookies.get(AUTH_COOKIE) or ""
        header = request.headers.get("authorization", "")
        if header.startswith("Bearer "):
            offered = header[len("Bearer ") :]
        return "token holder" if self.valid_token(offered) else None

    def valid_token(self, offered: str) -> bool:
        return hmac.compare_digest(offered.encode(), self.token.encode())

    def csrf(self, session: str) -> str:
        """The CSRF token of a browser session."""
        return hmac.new(self._secret, session.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session: str | None, offered: str | None) -> bool:
        if not session or not offered:
            return False
        return hmac.compare_digest(self.csrf(session), offered)
