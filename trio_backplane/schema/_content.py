"""``content_assertion=True``: ``contentEncoding``, ``contentMediaType`` and
``contentSchema`` as assertions, on a decoded copy (the arguments are never
changed).  A failure the engine's verdict could hide (a regex work limit, a
limit in decoded content) is noted per thread and raised whatever the verdict."""

from __future__ import annotations

import base64
import binascii
import functools
import json
import threading
from collections.abc import Callable
from typing import Any, Final

import attrs
import jsonschema_rs

from ..errors import Error, ErrorClass
from ._errors import limit_error, regex_failure, unsupported
from ._instance import first_violation

__all__ = [
    "ContentSchemaResolver",
    "check_content_keywords",
    "clear_content_failure",
    "content_keywords",
    "take_content_failure",
]

#: ``(schema_path, value)`` of a ``contentSchema`` keyword -> a getter of its
#: validator (a getter: a recursive one is still being built when asked for).
ContentSchemaResolver = Callable[[list[str | int], Any], Callable[[], jsonschema_rs.Validator]]

_noted = threading.local()


def clear_content_failure() -> None:
    """Forget a failure a content keyword noted on this thread (before a
    validation), and the verdicts it remembered."""
    _noted.message = None
    _noted.verdicts = {}


def take_content_failure() -> str | Error | None:
    """The failure a content keyword noted on this thread, if any (a regex
    failure's message, or a limit's ``Error``); clears it, and the verdicts
    remembered (they hold decoded text: kept no longer than one pass)."""
    message: str | Error | None = getattr(_noted, "message", None)
    _noted.message = None
    _noted.verdicts = {}
    return message


def _verdicts() -> dict[tuple[int, str], str | None]:
    """The verdicts of ``contentSchema`` keywords in this pass of the engine,
    by (keyword, text): one keyword judging the same text again (each
    branch of an ``anyOf`` around a recursive ``contentSchema`` re-enters
    every level below) answers at once, so a pass costs what the distinct
    texts do, never a power of the nesting."""
    verdicts: dict[tuple[int, str], str | None] | None = getattr(_noted, "verdicts", None)
    if verdicts is None:
        verdicts = _noted.verdicts = {}
    return verdicts


def _note_limit(error: Error) -> None:
    """A limit hit inside decoded content: the engine sees a mismatch, which
    ``not`` or ``oneOf`` would turn into a pass; the validation raises this
    instead, whatever the verdict."""
    if getattr(_noted, "message", None) is None:
        _noted.message = error


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


#: How deep decoded content may nest whatever ``max_input_depth`` allows:
#: Python's JSON parser recurses per level, within the interpreter's
#: recursion limit (1000 by default) and the frames below it.
_PARSE_DEPTH: Final = 512


@attrs.frozen
class _Bounds:
    """The limits decoded content is held to: the instance limits of the
    schema's ``Limits`` (``max_input_bytes``, and ``max_input_depth`` up to
    :data:`_PARSE_DEPTH`, the depth reported)."""

    depth: int
    size: int

    def too_deep(self) -> Error:
        return limit_error("input_too_deep", "max_input_depth", self.depth, role="content")


def _parsed(parent: dict[str, Any], instance: str, bounds: _Bounds) -> Any:
    data = _decoded(parent, instance)  # no larger than the arguments holding it
    try:
        value = json.loads(
            data.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float
        )
    except RecursionError as exc:
        _note_limit(bounds.too_deep())
        raise ValueError("content is not valid JSON") from exc
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # CPython's digit limit
            _note_limit(_too_many_digits())
        raise ValueError("content is not valid JSON") from exc
    violation = first_violation(value, bounds.depth, bounds.size)
    if violation is not None:
        reason = violation[0]
        if reason == "input_too_deep":
            _note_limit(bounds.too_deep())
        elif reason == "input_too_large":
            _note_limit(limit_error(reason, "max_input_bytes", bounds.size, role="content"))
        elif reason == "integer_too_large":
            _note_limit(_too_many_digits())
        raise ValueError("content is not JSON data within the input limits")
    return value


def _finite_float(text: str) -> float:
    """A JSON number as a float; one a double cannot hold (``1e400``: valid
    JSON) cannot be compared faithfully: a noted failure, never a mismatch
    ``not`` would turn into a pass."""
    value = float(text)
    if value - value != 0.0:
        _note_limit(
            Error(
                ErrorClass.EXECUTION_FAILURE,
                "number is too large to compare faithfully",
                {"reason": "number_too_large", "role": "content"},
            )
        )
        raise ValueError("number out of range")
    return value


def _too_many_digits() -> Error:
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        "integer is too large to compare faithfully",
        {"reason": "integer_too_large", "maximum": 4300, "role": "content"},
    )


class _ContentEncoding:
    def __init__(self, parent: dict[str, Any], value: Any, schema_path: list[str | int]) -> None:
        self.parent = parent

    def validate(self, instance: Any) -> None:
        if type(instance) is str:
            _decoded(self.parent, instance)


class _ContentMediaType:
    def __init__(
        self, bounds: _Bounds, parent: dict[str, Any], value: Any, schema_path: list[str | int]
    ) -> None:
        self.bounds = bounds
        self.parent = parent
        self.media_type = value if type(value) is str else ""

    def validate(self, instance: Any) -> None:
        if type(instance) is not str:
            return
        if _is_json_media_type(self.media_type):
            _parsed(self.parent, instance, self.bounds)
        else:
            try:
                _decoded(self.parent, instance).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError("content is not valid text") from exc


class _ContentSchema:
    def __init__(  # noqa: PLR0917 - the engine's three, after what the compilation binds
        self,
        resolve: ContentSchemaResolver,
        written: Callable[[str], str] | None,
        bounds: _Bounds,
        parent: dict[str, Any],
        value: Any,
        schema_path: list[str | int],
    ) -> None:
        self.bounds = bounds
        self.parent = parent
        self.written = written
        media_type = parent.get("contentMediaType")
        applies = type(media_type) is str and _is_json_media_type(media_type)
        self.validator = resolve(schema_path, value) if applies else None

    def validate(self, instance: Any) -> None:
        if self.validator is None or type(instance) is not str:
            return
        verdicts = _verdicts()
        key = (id(self), instance)
        if key in verdicts:
            verdict = verdicts[key]
        else:
            verdict = verdicts[key] = self._judge(instance)
        if verdict is not None:
            raise ValueError(verdict)

    def _judge(self, instance: str) -> str | None:
        """Why ``instance`` does not match (``None`` when it does): one pass
        of the engine over the decoded value."""
        try:
            value = _parsed(self.parent, instance, self.bounds)
        except ValueError as exc:
            return str(exc)
        errors = list(self.validator().iter_errors(value))  # type: ignore[misc]
        if not errors:
            return None
        message = regex_failure(errors)
        if message is not None:
            _noted.message = message
            return "contentSchema exceeded the regex work limit"
        first = errors[0].message
        if self.written is not None:
            first = self.written(first)
        return f"content does not match contentSchema: {first}"[:500]


def content_keywords(
    resolve: ContentSchemaResolver,
    written: Callable[[str], str] | None,
    max_depth: int,
    max_bytes: int,
) -> dict[str, Any]:
    """The engine's ``keywords=`` for ``content_assertion=True``; ``written``
    names in a message the patterns the engine was given spelled out as the
    schema writes them; decoded content is held to ``max_depth`` nesting and
    ``max_bytes`` bytes (the schema's instance limits)."""
    bounds = _Bounds(min(max_depth, _PARSE_DEPTH), max_bytes)
    return {
        "contentEncoding": _ContentEncoding,
        "contentMediaType": functools.partial(_ContentMediaType, bounds),
        "contentSchema": functools.partial(_ContentSchema, resolve, written, bounds),
    }
