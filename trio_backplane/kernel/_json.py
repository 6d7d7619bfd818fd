"""Compact JSON text of JSON data, frozen or not: one C encoder, built once.

``json.JSONEncoder.encode`` builds a C encoder on every call; this module
builds it once.  The text is what ``JSONEncoder(ensure_ascii=False,
allow_nan=False, separators=(",", ":")).encode`` gives, without the
circular-reference markers: frozen values have no cycles, and a value nested
too deep still raises ``RecursionError``.  ``FrozenDict``/``FrozenList`` are
``dict``/``tuple`` subclasses, so they encode as they are, with no thaw.
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["dumps", "utf8_size"]

_encoder: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_make_c_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_chunks: Any = (
    _make_c_encoder(
        None, _encoder.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    if _make_c_encoder is not None
    else lambda value, _: (_encoder.encode(value),)  # pragma: no cover - CPython has it
)


def dumps(value: Any) -> str:
    """Compact JSON text (UTF-8 kept, NaN refused): ``TypeError`` or
    ``ValueError`` for anything that is not JSON data."""
    return "".join(_chunks(value, 0))


def utf8_size(value: Any) -> int:
    """Bytes of ``value`` as UTF-8: a str itself, anything else as :func:`dumps` text."""
    text = value if isinstance(value, str) else dumps(value)
    return len(text.encode("utf-8", "surrogatepass"))
