"""``content_assertion=True``: ``contentEncoding``, ``contentMediaType`` and
``contentSchema`` as assertions (SCH-14).

Draft 2020-12 makes them annotations; a host that wants them enforced opts
in, and then an encoding or media type we cannot check is refused at
preflight (``unsupported_capability``) rather than silently passed.  The
arguments are never decoded in place: decoding happens on a copy, only to
judge the verdict.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any, Final

import jsonschema_rs

from ._errors import unsupported
from ._instance import first_violation

__all__ = ["CONTENT_KEYWORDS", "check_content_keywords"]

_DECODERS: Final[dict[str, Callable[[str], bytes]]] = {
    "base64": lambda s: base64.b64decode(s, validate=True),
    "base64url": lambda s: base64.urlsafe_b64decode(_strict_urlsafe(s)),
    "base32": base64.b32decode,
    "base16": base64.b16decode,
}


def _strict_urlsafe(s: str) -> str:
    if not all(c.isalnum() or c in "-_=" for c in s):
        raise binascii.Error("invalid base64url data")
    return s


def _is_json_media_type(media_type: str) -> bool:
    essence = media_type.split(";", 1)[0].strip().lower()
    return essence == "application/json" or essence.endswith("+json")


def _is_text_media_type(media_type: str) -> bool:
    return media_type.split(";", 1)[0].strip().lower().startswith("text/")


def check_content_keywords(node: dict[str, Any], where: str) -> None:
    """Refuse, at preflight, a content keyword value we cannot assert."""
    encoding = node.get("contentEncoding")
    if type(encoding) is str and encoding.lower() not in _DECODERS:
        raise unsupported("contentEncoding cannot be asserted", encoding=encoding, path=where)
    media_type = node.get("contentMediaType")
    if (
        type(media_type) is str
        and not _is_json_media_type(media_type)
        and not _is_text_media_type(media_type)
    ):
        raise unsupported("contentMediaType cannot be asserted", media_type=media_type, path=where)


def _decoded(parent: dict[str, Any], instance: str) -> bytes:
    encoding = parent.get("contentEncoding")
    if type(encoding) is str:
        try:
            return _DECODERS[encoding.lower()](instance)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"content is not valid {encoding}") from exc
    return instance.encode("utf-8")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parsed(parent: dict[str, Any], instance: str) -> Any:
    data = _decoded(parent, instance)
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise ValueError("content is not valid JSON") from exc
    if first_violation(value, 128, 1_048_576) is not None:
        raise ValueError("content is not JSON data within the input limits")
    return value


class _ContentEncoding:
    def __init__(self, parent: dict[str, Any], value: Any, schema_path: list[str | int]) -> None:
        self.parent = parent

    def validate(self, instance: Any) -> None:
        if type(instance) is str:
            _decoded(self.parent, instance)


class _ContentMediaType:
    def __init__(self, parent: dict[str, Any], value: Any, schema_path: list[str | int]) -> None:
        self.parent = parent
        self.media_type = value if type(value) is str else ""

    def validate(self, instance: Any) -> None:
        if type(instance) is not str:
            return
        if _is_json_media_type(self.media_type):
            _parsed(self.parent, instance)
        else:
            try:
                _decoded(self.parent, instance).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError("content is not valid text") from exc


class _ContentSchema:
    def __init__(self, parent: dict[str, Any], value: Any, schema_path: list[str | int]) -> None:
        self.parent = parent
        media_type = parent.get("contentMediaType")
        self.applies = type(media_type) is str and _is_json_media_type(media_type)
        self.validator = (
            jsonschema_rs.Draft202012Validator(value, offline=True) if self.applies else None
        )

    def validate(self, instance: Any) -> None:
        if self.validator is None or type(instance) is not str:
            return
        value = _parsed(self.parent, instance)
        for error in self.validator.iter_errors(value):
            raise ValueError(f"content does not match contentSchema: {error.message}"[:500])


CONTENT_KEYWORDS: Final[dict[str, Any]] = {
    "contentEncoding": _ContentEncoding,
    "contentMediaType": _ContentMediaType,
    "contentSchema": _ContentSchema,
}
