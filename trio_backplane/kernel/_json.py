"""Compact JSON text of JSON data, frozen or not: one C encoder, built once.

``json.JSONEncoder.encode`` builds a C encoder on every call; this module
builds it once.  The text is what ``JSONEncoder(ensure_ascii=False,
allow_nan=False, separators=(",", ":")).encode`` gives, without the
circular-reference markers: frozen values have no cycles, and a value nested
too deep still raises ``RecursionError``.  ``FrozenDict``/``FrozenList`` are
``dict``/``list`` subclasses, so they encode as they are, with no thaw; a
``LayeredDict`` encodes as the ``dict`` it stands for.
"""

from __future__ import annotations

import json
from typing import Any, Final

from ._frozen import LayeredDict, _accelerator

__all__ = ["dumps", "loads", "utf8_size"]

_OPTIONS: Final[dict[str, Any]] = {
    "ensure_ascii": False,
    "allow_nan": False,
    "separators": (",", ":"),
}
_encoder: Final = json.JSONEncoder(**_OPTIONS)
_make_c_encoder: Any = getattr(json.encoder, "c_make_encoder", None)


def _default(value: Any) -> Any:
    """What the encoder writes for an object it does not know: a
    ``LayeredDict`` as the ``dict`` it stands for, nothing else."""
    if type(value) is LayeredDict:
        return value.as_dict()
    return _encoder.default(value)  # raises TypeError


_chunks: Any = (
    _make_c_encoder(
        None, _default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    if _make_c_encoder is not None
    else lambda value, _: (json.dumps(value, default=_default, **_OPTIONS),)  # pragma: no cover
)


#: The C accelerator's encoder (one buffer, no object per token) of data
#: whose every str is ASCII; it declines the rest to ``_chunks``.
_fast_dumps: Final[Any] = getattr(_accelerator, "dumps", None)


def dumps(value: Any) -> str:
    """Compact JSON text (UTF-8 kept, NaN refused): ``TypeError`` or
    ``ValueError`` for anything that is not JSON data."""
    if _fast_dumps is not None:
        text = _fast_dumps(value)
        if text is not NotImplemented:
            return text  # type: ignore[no-any-return]
    return "".join(_chunks(value, 0))


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value - value != 0.0:
        raise ValueError(f"number {text[:40]} is too large for a double")
    return value


#: One decoder for every parse: each float literal is checked as it is read
#: (a Python call per float, no scan of the text).
_decode: Final = json.JSONDecoder(parse_constant=_not_a_number, parse_float=_finite).decode


def loads(text: str | bytes) -> Any:
    """JSON text parsed strictly: ``NaN`` and ``Infinity``, which Python's
    ``json`` accepts but JSON does not, and numbers that overflow a double
    (``1e999``, valid JSON that Python reads as ``inf``), raise
    ``ValueError`` like any other text that is not JSON (so a value parsed
    here can always be committed)."""
    if not isinstance(text, str):
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    return _decode(text)


def utf8_size(value: Any) -> int:
    """Bytes of ``value`` as UTF-8: a str itself, anything else as :func:`dumps` text."""
    text = value if isinstance(value, str) else dumps(value)
    return len(text.encode("utf-8", "surrogatepass"))
