"""What every HTTP provider is constructed with, checked once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import httpx

from ..._numbers import is_seconds
from ...errors import Error, ErrorClass
from ...kernel import check_json

__all__ = ["HttpOptions", "http_options"]


@attrs.frozen(kw_only=True)
class HttpOptions:
    """A provider's endpoint and transport: ``url`` (the endpoint, not the
    root), ``model``, the shared ``client`` (``None``: one an attempt),
    ``timeout`` (connecting, each read), ``tail_timeout`` (after the finish
    reason), ``system``, ``extra_body`` and ``streaming``."""

    url: str
    model: str
    client: httpx.AsyncClient | None
    timeout: float
    tail_timeout: float
    system: str | None
    extra_body: Mapping[str, Any]
    streaming: bool


def http_options(
    *,
    base_url: Any,
    path: str,
    model: Any,
    client: Any,
    timeout: Any,
    tail_timeout: Any,
    system: Any,
    extra_body: Any,
    streaming: Any,
) -> HttpOptions:
    """The options, ``path`` appended to ``base_url``; raises ``validation``
    naming the first one of the wrong kind."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise Error(ErrorClass.VALIDATION, "base_url must be an http(s) URL")
    if not isinstance(model, str) or not model:
        raise Error(ErrorClass.VALIDATION, "model must be a non-empty str")
    for name, seconds in (("timeout", timeout), ("tail_timeout", tail_timeout)):
        if not is_seconds(seconds):
            raise Error(ErrorClass.VALIDATION, f"{name} must be a positive number")
    if system is not None and type(system) is not str:
        raise Error(ErrorClass.VALIDATION, "system must be a str or None")
    if extra_body is not None:
        if not isinstance(extra_body, Mapping):
            raise Error(ErrorClass.VALIDATION, "extra_body must be a mapping or None")
        check_json(dict(extra_body), "extra_body")
    if type(streaming) is not bool:
        raise Error(ErrorClass.VALIDATION, "streaming must be a bool")
    if client is not None and not isinstance(client, httpx.AsyncClient):
        raise Error(ErrorClass.VALIDATION, "client must be an httpx.AsyncClient or None")
    return HttpOptions(
        url=base_url.rstrip("/") + path,
        model=model,
        client=client,
        timeout=float(timeout),
        tail_timeout=float(tail_timeout),
        system=system,
        extra_body=dict(extra_body or {}),
        streaming=streaming,
    )
