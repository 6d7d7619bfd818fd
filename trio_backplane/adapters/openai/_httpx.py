"""The ``openai`` extra's import, in one place: whichever module of the
adapter is imported first, a missing extra is reported by name."""

from __future__ import annotations

from .. import _missing_extra

try:
    import httpx
except ModuleNotFoundError as _missing:  # pragma: no cover - depends on the install
    raise _missing_extra("openai", _missing) from _missing

__all__ = ["httpx"]
