"""Frozen data derived from frozen data: a mapping with a key set or
removed, a list grown, and which keys changed between two derived mappings."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from ._frozen import (
    _LINEAGE_MAX,
    FrozenDict,
    FrozenList,
    LayeredDict,
    _accelerator,
    freeze,
)

__all__ = ["appended", "assoc", "changed_keys", "dissoc", "grown", "put"]

#: The mapping types :func:`put`/:func:`assoc`/:func:`dissoc` derive.
Derived = FrozenDict | LayeredDict
_DERIVED: Final = (FrozenDict, LayeredDict)

#: A mapping this large is derived as a ``LayeredDict`` (smaller: copied).
_LAYER_FROM = 64
#: A ``LayeredDict`` overlay this large is merged into a new base.
_OVERLAY_MAX = 32
# Neither is ``Final``: the test suite lowers both (tests/conftest.py) so
# that small runs take the layered path too.

_fast_put: Callable[[Any, str, Any, int, int], Any] | None = getattr(_accelerator, "put", None)


def _derive(old: Mapping[str, Any], new: Derived, key: str) -> Derived:
    """Record that ``new`` is ``old`` with ``key`` changed (see ``FrozenDict``)."""
    derived = type(old) in _DERIVED
    lineage = getattr(old, "_lineage", None) if derived else None
    if lineage is None and derived and old:
        # Root a lineage at ``old`` (never at an empty mapping: the shared
        # empty one would hold a run's log for the process's lifetime).
        lineage = ([], 0)
        old._lineage = lineage  # type: ignore[attr-defined]
    if lineage is not None:
        log, version = lineage
        if version == len(log) < _LINEAGE_MAX:  # ``old`` is the newest: extend
            log.append(key)
            new._lineage = (log, version + 1)
            return new
    new._lineage = ([key], 1)  # a branch: a new log
    return new


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str] | None:
    """The keys (maybe repeated) whose entries may differ between ``old`` and
    ``new`` when ``new`` was derived from ``old`` by :func:`assoc`, :func:`put`
    and :func:`dissoc`; ``None`` when that is not known (compare them all)."""
    a = getattr(old, "_lineage", None) if type(old) in _DERIVED else None
    b = getattr(new, "_lineage", None) if type(new) in _DERIVED else None
    if a is None or b is None or a[0] is not b[0] or b[1] < a[1]:
        return None
    log: list[str] = b[0]
    return log[a[1] : b[1]]


def _set(mapping: Mapping[str, Any], key: str, value: Any) -> Derived:
    """``mapping`` with ``key`` set to the frozen ``value``, ``mapping`` itself
    frozen: a ``LayeredDict`` once it is large, else one C-speed copy."""
    kind = type(mapping)
    if kind is LayeredDict:
        layered: LayeredDict = mapping  # type: ignore[assignment]
        over = layered._over
        base = layered._base
        if len(over) < _OVERLAY_MAX or key in over:
            grown = dict(over)
            grown[key] = value
            size = layered._len if key in over or key in base else layered._len + 1
            return LayeredDict(base, grown, size)
        merged = FrozenDict(base)
        dict.update(merged, over)
        dict.__setitem__(merged, key, value)
        return merged
    if kind is FrozenDict and len(mapping) >= _LAYER_FROM:
        frozen: FrozenDict = mapping  # type: ignore[assignment]
        return LayeredDict(frozen, {key: value}, len(frozen) + (key not in frozen))
    new = FrozenDict(mapping)
    dict.__setitem__(new, key, value)
    return new


def assoc(mapping: Mapping[str, Any], key: str, value: Any) -> Mapping[str, Any]:
    """``mapping`` with ``key`` set to frozen ``value``: one C-speed copy (a
    ``LayeredDict`` layer once ``mapping`` is large), the other (already
    frozen) values shared."""
    return put(mapping, key, freeze(value))


def put(mapping: Mapping[str, Any], key: str, value: Any) -> Mapping[str, Any]:
    """:func:`assoc` for a ``value`` the kernel built itself from frozen parts
    (a ``FrozenDict`` of scalars and frozen values): no walk."""
    # The C accelerator derives a FrozenDict or a LayeredDict (str keys)
    # exactly as the Python code does, lineage included.
    if _fast_put is not None:
        new = _fast_put(mapping, key, value, _LAYER_FROM, _OVERLAY_MAX)
        if new is not NotImplemented:
            return new  # type: ignore[no-any-return]
    return _derive(mapping, _set(mapping, key, value), key)


def _grown_python(
    items: list[Any] | tuple[Any, ...], more: list[Any] | tuple[Any, ...]
) -> FrozenList:
    # ``FrozenList(items)`` of a list subclass copies through an iterator;
    # a slice is an exact list, copied at C speed.
    out = list(items[:])
    out.extend(more)
    return FrozenList(out)


#: ``grown(items, more)``: a new ``FrozenList`` of the items of ``items``, then
#: those of ``more`` (both lists or tuples of frozen values): the C
#: accelerator's, else the Python copy.
grown: Callable[[Any, Any], FrozenList] = getattr(_accelerator, "grown", _grown_python)


def appended(items: Any, *values: Any) -> FrozenList:
    """``items`` (frozen already, or any sequence of frozen values) with
    ``values`` frozen and appended: one C-speed copy of ``items``."""
    out = FrozenList(items)
    for value in values:
        list.append(out, freeze(value))
    return out


def dissoc(mapping: Mapping[str, Any], key: str) -> FrozenDict:
    """``mapping`` without ``key``."""
    new = FrozenDict(mapping.as_dict() if type(mapping) is LayeredDict else mapping)
    dict.pop(new, key, None)
    _derive(mapping, new, key)
    return new
