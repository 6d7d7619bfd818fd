"""Frozen JSON data: the read-only containers of committed records,
:func:`freeze` (checked JSON data to frozen data) and :func:`thaw` (back).

The optional C accelerator ``_speedups`` is imported and configured here; the
Python code is the reference and the fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, final

from ..errors import Error, ErrorClass

__all__ = [
    "MAX_DEPTH",
    "RECORD_DEPTH",
    "FrozenDict",
    "FrozenList",
    "LayeredDict",
    "check_json",
    "freeze",
    "thaw",
]


@final
class FrozenDict(dict[str, Any]):
    """A ``dict`` that refuses mutation: the mapping type of committed records.

    A ``dict`` subclass so JSON encoders write it at C speed; only
    :func:`freeze` builds one, after checking every value is JSON data, so a
    ``FrozenDict`` (or ``FrozenList``) met again is known frozen and reused as
    is: evolving a record copies only what changed.

    ``_lineage`` (set by :func:`assoc`, :func:`put` and :func:`dissoc`, never
    part of the value) is ``(log, version)``: mappings derived one from the
    other share ``log``, the keys each derivation changed, and ``version`` is
    how many of them this mapping has seen, so :func:`changed_keys` names what
    changed between two of them without reading every entry.
    """

    __slots__ = ("_lineage",)
    _lineage: tuple[list[str], int]

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("committed records are read-only")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: Any) -> FrozenDict:
        return self

    def __reduce__(self) -> Any:
        return (_frozen_dict, (dict(self),))


def _frozen_dict(data: dict[str, Any]) -> FrozenDict:
    return FrozenDict(data)


@final
class FrozenList(list[Any]):
    """A ``list`` that refuses mutation: the array type of committed records.

    A ``list`` subclass so providers, encoders and ``==`` treat it as the JSON
    array it is; only :func:`freeze` builds one, after checking its items.
    """

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("committed records are read-only")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = clear = extend = insert = pop = remove = reverse = sort = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: Any) -> FrozenList:
        return self

    def __reduce__(self) -> Any:
        return (FrozenList, (list(self),))


_MISSING: Final = object()


@final
class LayeredDict(Mapping[str, Any]):
    """A read-only mapping that grows without copying its entries.

    :func:`put`, :func:`assoc` and :func:`reserve` return one for a mapping of
    at least ``_LAYER_FROM`` entries: a shared ``base`` (a ``FrozenDict`` no
    one mutates) and a small overlay of the keys set since, copied at each
    derivation and merged into a new base once it holds ``_OVERLAY_MAX``
    keys.  A run's growing maps (intents, tool results, reservations) then
    cost O(1) amortized per change instead of a copy of the whole run.

    Iteration order is a ``dict``'s: the base's keys in order (a key set
    again keeps its place), then the keys new in the overlay.  Its values are
    frozen, so it is frozen too.  It is not a ``dict``: ``kernel.dumps`` and
    :func:`thaw` handle it, ``dict(m)`` copies it.
    """

    __slots__ = ("_base", "_len", "_lineage", "_over")
    _lineage: tuple[list[str], int]

    def __init__(self, base: FrozenDict, over: dict[str, Any], length: int) -> None:
        self._base = base
        self._over = over
        self._len = length

    def __getitem__(self, key: str) -> Any:
        value = self._over.get(key, _MISSING)
        return self._base[key] if value is _MISSING else value

    def get(self, key: str, default: Any = None) -> Any:
        value = self._over.get(key, _MISSING)
        return self._base.get(key, default) if value is _MISSING else value

    def __contains__(self, key: object) -> bool:
        return key in self._over or key in self._base

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        base = self._base
        yield from base
        for key in self._over:
            if key not in base:
                yield key

    def __reversed__(self) -> Iterator[str]:
        base = self._base
        for key in reversed(self._over):
            if key not in base:
                yield key
        yield from reversed(base)

    def as_dict(self) -> dict[str, Any]:
        """A plain ``dict`` of the same entries, in the same order (O(n))."""
        merged = dict(self._base)
        merged.update(self._over)
        return merged

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LayeredDict):
            return self.as_dict() == other.as_dict()
        if isinstance(other, Mapping):
            return self.as_dict() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.as_dict())

    def __copy__(self) -> LayeredDict:
        return self

    def __deepcopy__(self, memo: Any) -> LayeredDict:
        return self

    def __reduce__(self) -> Any:
        return (_frozen_dict, (self.as_dict(),))


#: A lineage log longer than this starts over (memory stays bounded).
_LINEAGE_MAX: Final = 1 << 20

# The C accelerator (``_speedups.c``), imported once: ``freeze``, ``put``,
# ``grown`` and the record copy use it when it is built; the Python code is
# the reference and the fallback.
_accelerator: Any
try:
    from . import _speedups as _accelerator
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _accelerator = None
else:
    _accelerator.configure(FrozenDict, FrozenList, LayeredDict, _LINEAGE_MAX)
_fast_freeze: Callable[[Any, int], Any] | None = getattr(_accelerator, "freeze", None)


_EMPTY: Final[Mapping[str, Any]] = FrozenDict()
_EMPTY_LIST: Final = FrozenList()


#: The deepest nesting of JSON data :func:`freeze` accepts from a caller
#: (containers counted from 1): far beyond any real message, and with the few
#: levels a record adds around it (:data:`RECORD_DEPTH`) well within what the
#: recursive operations on committed data (the SQL stores' JSON codecs,
#: ``thaw``, equality) can do under the interpreter's recursion limit.
MAX_DEPTH: Final = 256
#: What a record's own fields may nest: a value accepted at ``MAX_DEPTH``
#: plus the levels the record adds around it, so a stored record decodes.
RECORD_DEPTH: Final = MAX_DEPTH + 64


def check_json(value: Any, what: str = "committed intent") -> None:
    """Raise ``validation`` unless ``value`` is JSON data (as :func:`freeze`)."""
    freeze(value, what)


def freeze(value: Any, what: str = "committed intent", limit: int = MAX_DEPTH) -> Any:
    """A read-only deep copy of JSON data (``FrozenDict``/``FrozenList``),
    reusing values that are already frozen.

    Raises ``validation`` "<what> contains a runtime handle" for a callable, a
    channel, a task or any other non-JSON object, "<what> has a key that is
    not a string" for a mapping key of another type, and "<what> nests deeper
    than <limit> levels" past ``limit`` (:data:`MAX_DEPTH`; a record's own
    fields allow :data:`RECORD_DEPTH`).
    """
    # Every store must encode and decode what is committed (JSON codecs
    # recurse), so the depth limit refuses the same data on every store,
    # before it is stored.  The C accelerator builds the same value for data
    # of exact built-in types; what it declines, the Python walk decides
    # (same results, same errors): recursive while shallow, then on an
    # explicit stack past ``_RECURSION`` levels, so no input overflows it.
    if type(value) in _KEPT:  # frozen already, or a leaf: most calls, no second call
        return value
    if _fast_freeze is not None:
        frozen = _fast_freeze(value, limit)
        if frozen is not NotImplemented:
            return frozen
    try:
        return _freeze(value, what, 0, limit)
    except Error:
        raise
    except Exception as exc:  # a mapping or sequence that fails while read
        raise Error(
            ErrorClass.VALIDATION,
            f"{what} could not be read as JSON data",
            {"cause": f"{type(exc).__name__}: {exc}"[:300]},
        ) from exc


#: Nesting walked by recursion; deeper levels continue on an explicit stack.
_RECURSION: Final = 64


#: Types :func:`freeze` returns as they are: JSON leaves (``None`` included;
#: ints need a size check, floats a finiteness check, strs a Unicode check)
#: and the frozen containers.
_KEPT: Final = frozenset({bool, type(None), FrozenDict, FrozenList, LayeredDict})

#: The most decimal digits an integer in JSON data may have: what CPython
#: writes and reads by default (``sys.get_int_max_str_digits``).  A larger
#: one could not be encoded by a store, or not be read back by another
#: process, so it is refused before it is committed.
MAX_INT_DIGITS: Final = 4300
_INT_BOUND: Final = 10**MAX_INT_DIGITS  # the smallest integer with more digits


def _integer(value: int, what: str) -> int:
    if -_INT_BOUND < value < _INT_BOUND:
        return value
    raise Error(
        ErrorClass.VALIDATION,
        f"{what} contains an integer of more than {MAX_INT_DIGITS} digits",
        {"reason": "integer_too_large", "maximum_digits": MAX_INT_DIGITS},
    )


def _is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text (no lone surrogate)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _text(value: str, what: str) -> str:
    """``value`` if it is Unicode text: a str holding a lone UTF-16 surrogate
    is not, and no store could encode it as UTF-8.  ASCII costs a flag read;
    other text one UTF-8 encoding (C speed, faster than any scan)."""
    if value.isascii() or _is_text(value):
        return value
    raise Error(
        ErrorClass.VALIDATION,
        f"{what} contains text that is not valid Unicode (a lone surrogate)",
        {"reason": "lone_surrogate"},
    )


def _freeze(value: Any, what: str, depth: int, limit: int = MAX_DEPTH) -> Any:
    t = type(value)
    if t in _KEPT:
        return value
    if t is int:
        return _integer(value, what)
    if t is str:
        return _text(value, what)
    if t is float:
        if value - value != 0.0:
            raise Error(ErrorClass.VALIDATION, f"{what} contains a non-finite number")
        return value
    if depth >= _RECURSION:
        return _freeze_iterative(value, what, depth, limit)
    # Containers: items that need no work are kept without a call (the hot
    # path: a fresh mapping of strings, numbers and already-frozen values).
    if t is dict or (t is not list and t is not tuple and isinstance(value, Mapping)):
        if t is dict:
            # The commonest case: a fresh dict of leaves and frozen values is
            # copied once, by the FrozenDict constructor, after one check.
            for key, item in value.items():
                ti = type(item)
                if (
                    type(key) is not str
                    or not (key.isascii() or _is_text(key))
                    or not (
                        ti in _KEPT
                        or (ti is int and -_INT_BOUND < item < _INT_BOUND)
                        or (ti is str and (item.isascii() or _is_text(item)))
                        or (ti is float and item - item == 0.0)
                    )
                ):
                    break
            else:
                return FrozenDict(value)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _key(what, key)
            _text(key, what)
            ti = type(item)
            if ti in _KEPT:
                out[key] = item
            else:
                out[key] = _freeze(item, what, depth + 1, limit)
        return FrozenDict(out)
    if t is list or t is tuple:
        return FrozenList(
            [
                item
                if type(item) in _KEPT
                or (type(item) is str and item.isascii())
                or (type(item) is int and -_INT_BOUND < item < _INT_BOUND)
                else _freeze(item, what, depth + 1, limit)
                for item in value
            ]
        )
    raise _handle(what, t)


def _too_deep(what: str, limit: int) -> Error:
    return Error(
        ErrorClass.VALIDATION, f"{what} nests deeper than {limit} levels", {"limit": limit}
    )


def _key(what: str, key: Any) -> Error:
    """``validation`` for a mapping key that is not a string (JSON object
    keys are strings; ``1`` and ``"1"`` would collide once encoded)."""
    return Error(
        ErrorClass.VALIDATION,
        f"{what} has a key that is not a string ({type(key).__name__})",
        {"reason": "non_string_key", "type": type(key).__name__},
    )


def _handle(what: str, kind: type) -> Error:
    """``validation`` for a value of type ``kind`` that is not JSON data."""
    return Error(
        ErrorClass.VALIDATION, f"{what} contains a runtime handle", {"type": kind.__name__}
    )


def _freeze_iterative(value: Any, what: str, depth: int = 0, limit: int = MAX_DEPTH) -> Any:
    t = type(value)
    if t in _KEPT:
        return value
    if t is int:
        return _integer(value, what)
    if t is str:
        return _text(value, what)
    if t is float:
        if value - value != 0.0:
            raise Error(ErrorClass.VALIDATION, f"{what} contains a non-finite number")
        return value
    # Containers: build bottom-up with an explicit stack.
    root: list[Any] = [None]
    stack: list[tuple[Any, list[Any], Any, int]] = [(value, root, 0, depth)]
    pending: list[tuple[list[Any], Any, Any, bool]] = []
    while stack:
        item, holder, slot, level = stack.pop()
        kind = type(item)
        if level >= limit and (kind is list or kind is tuple or isinstance(item, Mapping)):
            raise _too_deep(what, limit)
        if kind in _KEPT:
            holder[slot] = item
        elif kind is int:
            holder[slot] = _integer(item, what)
        elif kind is str:
            holder[slot] = _text(item, what)
        elif kind is float:
            if item - item != 0.0:
                raise Error(ErrorClass.VALIDATION, f"{what} contains a non-finite number")
            holder[slot] = item
        elif isinstance(item, Mapping):
            keys = list(item.keys())
            for key in keys:
                if type(key) is not str:
                    raise _key(what, key)
                _text(key, what)
            values: list[Any] = [None] * len(keys)
            pending.append((holder, slot, (keys, values), True))
            for i, key in enumerate(keys):
                stack.append((item[key], values, i, level + 1))
        elif kind is list or kind is tuple:
            values = [None] * len(item)
            pending.append((holder, slot, values, False))
            for i, sub in enumerate(item):
                stack.append((sub, values, i, level + 1))
        else:
            raise _handle(what, kind)
    # Containers were registered parent-first: build them child-first.
    for holder, slot, data, is_map in reversed(pending):
        if is_map:
            keys, values = data
            holder[slot] = FrozenDict(zip(keys, values, strict=True))
        else:
            holder[slot] = FrozenList(data)
    return root[0]


def thaw(value: Any) -> Any:
    """Plain ``dict``/``list`` JSON data from a frozen value."""
    t = type(value)
    if t is str or t is int or t is bool or t is float or value is None:
        return value
    if t is FrozenDict or t is dict or isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value
