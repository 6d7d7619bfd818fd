"""The checks of what every HTTP provider is constructed with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from ..._numbers import is_seconds
from ...errors import Error, ErrorClass
from ...kernel import check_json

__all__ = ["check_options"]


def check_options(
    *,
    base_url: Any,
    model: Any,
    timeouts: Mapping[str, Any],
    system: Any,
    extra_body: Any,
    client: Any,
) -> None:
    """Raise ``validation`` naming the first option of the wrong kind."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise Error(ErrorClass.VALIDATION, "base_url must be an http(s) URL")
    if not isinstance(model, str) or not model:
        raise Error(ErrorClass.VALIDATION, "model must be a non-empty str")
    for name, seconds in timeouts.items():
        if not is_seconds(seconds):
            raise Error(ErrorClass.VALIDATION, f"{name} must be a positive number")
    if system is not None and type(system) is not str:
        raise Error(ErrorClass.VALIDATION, "system must be a str or None")
    if extra_body is not None:
        if not isinstance(extra_body, Mapping):
            raise Error(ErrorClass.VALIDATION, "extra_body must be a mapping or None")
        check_json(dict(extra_body), "extra_body")
    if client is not None and not isinstance(client, httpx.AsyncClient):
        raise Error(ErrorClass.VALIDATION, "client must be an httpx.AsyncClient or None")
