"""The run record, its budget, commands and events: frozen JSON-data records."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass

__all__ = [
    "ACTIVE_STATES",
    "GROWING",
    "MAX_RUN_ID",
    "INTENT_STATUSES",
    "RUN_STATES",
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "Budget",
    "Command",
    "RunEvent",
    "RunRecord",
    "FrozenDict",
    "FrozenList",
    "LayeredDict",
    "appended",
    "assoc",
    "changed_keys",
    "check_json",
    "check_run_id",
    "dissoc",
    "evolve_record",
    "freeze",
    "put",
    "thaw",
    "reserve",
]

#: Version of the record layout written by this code (the codec checks it;
#: version 1 kept the transcript and usage inside ``context["conversation"]``).
SCHEMA_VERSION: Final = 2
#: The record's growing sequences: appended to, never rewritten, and stored
#: one row per item by the SQL stores.
GROWING: Final = ("transcript", "usage")

TERMINAL_STATES: Final = frozenset(
    {"completed", "failed", "cancelled", "timed_out", "unknown_outcome"}
)
ACTIVE_STATES: Final = frozenset({"queued", "running", "waiting_approval", "waiting_result"})
RUN_STATES: Final = ACTIVE_STATES | {"cancelling"} | TERMINAL_STATES
INTENT_STATUSES: Final = frozenset({"started", "consumed", "cancelled", "uncertain"})


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


#: The mapping types :func:`put`/:func:`assoc`/:func:`dissoc` derive.
Derived = FrozenDict | LayeredDict
_DERIVED: Final = (FrozenDict, LayeredDict)

#: A mapping this large is derived as a ``LayeredDict`` (smaller: copied).
_LAYER_FROM = 64
#: A ``LayeredDict`` overlay this large is merged into a new base.
_OVERLAY_MAX = 32
#: A lineage log longer than this starts over (memory stays bounded).
_LINEAGE_MAX: Final = 1 << 20


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
    """Raise ``validation`` unless ``value`` is JSON data (KER-11)."""
    freeze(value, what)


def freeze(value: Any, what: str = "committed intent", limit: int = MAX_DEPTH) -> Any:
    """A read-only deep copy of JSON data (``FrozenDict``/``FrozenList``),
    reusing values that are already frozen.

    Raises ``validation`` "<what> contains a runtime handle" for a callable, a
    channel, a task or any other non-JSON object (KER-11), and "<what> nests
    deeper than <limit> levels" past ``limit`` (:data:`MAX_DEPTH`; a record's
    own fields allow :data:`RECORD_DEPTH`): every store must be able
    to encode and decode what is committed (JSON codecs recurse), so the same
    data is refused on every store, before it is stored.  Shallow values take
    a recursive fast path; anything nested deeper than ``_RECURSION`` levels
    continues on an explicit stack, so walking it is never a danger.  The
    optional C accelerator builds the same value for data of exact built-in
    types; what it declines, this walk decides (same results, same errors).
    """
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


_RECURSION: Final = 64

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
_fast_put: Callable[[Any, str, Any, int, int], Any] | None = getattr(_accelerator, "put", None)


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
                raise Error(
                    ErrorClass.VALIDATION,
                    f"{what} contains a runtime handle",
                    {"type": type(key).__name__},
                )
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
    raise Error(ErrorClass.VALIDATION, f"{what} contains a runtime handle", {"type": t.__name__})


def _too_deep(what: str, limit: int) -> Error:
    return Error(
        ErrorClass.VALIDATION, f"{what} nests deeper than {limit} levels", {"limit": limit}
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
                    raise Error(
                        ErrorClass.VALIDATION,
                        f"{what} contains a runtime handle",
                        {"type": type(key).__name__},
                    )
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
            raise Error(
                ErrorClass.VALIDATION, f"{what} contains a runtime handle", {"type": kind.__name__}
            )
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


def _frozen_mapping(value: Any) -> Mapping[str, Any]:
    if type(value) is FrozenDict or type(value) is LayeredDict:
        return value
    if value is None:
        return _EMPTY
    frozen = freeze(value, limit=RECORD_DEPTH)
    if type(frozen) is not FrozenDict and not isinstance(frozen, Mapping):
        raise Error(ErrorClass.VALIDATION, "expected a mapping")
    return frozen


#: Identities and counters are below this: what every store's integer
#: columns hold (SQLite's are 64-bit).
MAX_INT: Final = 2**63


def _positive(instance: Any, attribute: attrs.Attribute[int], value: Any) -> None:
    if type(value) is not int or not 0 < value < MAX_INT:
        raise Error(ErrorClass.VALIDATION, f"{attribute.name} must be a positive int below 2**63")


def _non_negative(instance: Any, attribute: attrs.Attribute[int], value: Any) -> None:
    if type(value) is not int or not 0 <= value < MAX_INT:
        raise Error(
            ErrorClass.VALIDATION, f"{attribute.name} must be a non-negative int below 2**63"
        )


_JSON_TYPES: Final = frozenset(
    {str, int, float, bool, type(None), list, dict, FrozenDict, FrozenList, LayeredDict}
)


def _wrong(attribute: Any, value: Any, expected: str) -> Error:
    """``validation`` for a field holding ``value``: "runtime handle" for a
    value that is not JSON data at all (KER-11), else what was expected."""
    details = {"field": attribute.name, "type": type(value).__name__}
    if type(value) not in _JSON_TYPES:
        return Error(ErrorClass.VALIDATION, "committed intent contains a runtime handle", details)
    return Error(ErrorClass.VALIDATION, f"{attribute.name} must be {expected}", details)


def _bool(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not bool:
        raise _wrong(attribute, value, "a bool")


def _optional_str(instance: Any, attribute: Any, value: Any) -> None:
    if value is not None and type(value) is not str:
        raise _wrong(attribute, value, "a str or None")


def _optional_time(instance: Any, attribute: Any, value: Any) -> None:
    if value is None:
        return
    if type(value) not in (int, float):
        raise _wrong(attribute, value, "a finite number or None")
    if value - value != 0:
        raise Error(ErrorClass.VALIDATION, f"{attribute.name} must be a finite number or None")


def _str_tuple(instance: Any, attribute: Any, value: tuple[Any, ...]) -> None:
    for item in value:
        if type(item) is not str:
            raise _wrong(attribute, item, "a tuple of str")


def _budget(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, Budget):
        raise _wrong(attribute, value, "a Budget")


def _quota(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not int or value < 1:
        raise Error(
            ErrorClass.VALIDATION, "work must be an int of at least 1", {"work": repr(value)}
        )


@final
@attrs.frozen
class Budget:
    """A finite work quota; every provider attempt and tool invocation reserves
    one unit under its reservation id (``"provider:<attempt>"``, ``"tool:<id>"``)."""

    quota: int = attrs.field(validator=_quota)
    used: int = attrs.field(default=0, validator=_non_negative)
    reservations: Mapping[str, int] = attrs.field(default=_EMPTY, converter=_frozen_mapping)


def _slot_setters(cls: type) -> dict[str, Any]:
    """Each slot's setter of the attrs class ``cls`` (the member descriptor's
    ``__set__``): setting through it skips the frozen ``__setattr__`` and the
    attribute lookup by name.  For instances the kernel builds from values
    it has checked."""
    return {field.name: getattr(cls, field.name).__set__ for field in attrs.fields(cls)}


_BUDGET_SETTERS: Final = _slot_setters(Budget)
_set_budget_quota: Final = _BUDGET_SETTERS["quota"]
_set_budget_used: Final = _BUDGET_SETTERS["used"]
_set_budget_reservations: Final = _BUDGET_SETTERS["reservations"]


def reserve(budget: Budget, reservation_id: str, amount: int = 1) -> Budget:
    """Reserve ``amount`` under ``reservation_id``; idempotent for the same
    amount (KER-12), ``budget_exceeded`` beyond the quota (KER-13)."""
    if type(amount) is not int or amount < 1:
        raise Error(ErrorClass.VALIDATION, "reservation amount must be a positive int")
    held = budget.reservations.get(reservation_id)
    if held is not None:
        if held == amount:
            return budget
        raise Error(
            ErrorClass.RESOURCE_CONFLICT,
            "reservation id already used with another amount",
            {"reservation_id": reservation_id, "held": held, "requested": amount},
        )
    if budget.used + amount > budget.quota:
        raise Error(
            ErrorClass.BUDGET_EXCEEDED,
            "work quota exhausted",
            {"used": budget.used, "requested": amount, "quota": budget.quota},
        )
    # Built slot by slot from checked parts (the quota as it was, a larger
    # non-negative int, a frozen mapping): no validator or converter to run.
    grown: Budget = object.__new__(Budget)
    _set_budget_quota(grown, budget.quota)
    _set_budget_used(grown, budget.used + amount)
    _set_budget_reservations(grown, assoc(budget.reservations, reservation_id, amount))
    return grown


def _state(instance: Any, attribute: Any, value: Any) -> None:
    if type(value) is not str or value not in RUN_STATES:
        raise Error(ErrorClass.VALIDATION, "unknown run state", {"state": repr(value)})


#: The longest run id.
MAX_RUN_ID: Final = 256


def check_run_id(value: Any) -> None:
    """``validation`` unless ``value`` is a run id: a non-empty str of at most
    :data:`MAX_RUN_ID` characters, no NUL (PostgreSQL text holds none: one
    store would refuse it as failed storage), valid Unicode (a record's, and
    every store call's)."""
    if type(value) is not str or not value or len(value) > MAX_RUN_ID or "\x00" in value:
        raise Error(
            ErrorClass.VALIDATION,
            f"run_id must be a non-empty str of at most {MAX_RUN_ID} chars, without NUL",
            {"argument": "run_id", "type": type(value).__name__},
        )
    _text(value, "run_id")


def _run_id(instance: Any, attribute: Any, value: Any) -> None:
    check_run_id(value)


def _optional_mapping(value: Any) -> Mapping[str, Any] | None:
    return None if value is None else _frozen_mapping(value)


def _frozen_list(value: Any) -> FrozenList:
    if type(value) is FrozenList:
        return value
    if value is None:
        return _EMPTY_LIST
    frozen = freeze(value, limit=RECORD_DEPTH)
    if type(frozen) is not FrozenList:
        raise Error(ErrorClass.VALIDATION, "expected a list")
    return frozen


@final
@attrs.frozen
class RunRecord:
    """One run, as committed: JSON data only (KER-11), frozen all the way down.

    ``intents`` maps ``"provider:<attempt_id>"``/``"tool:<invocation_id>"`` to
    ``{"kind", "status", "effect_class", "dispatch_state", ...}``;
    ``active_tools`` maps invocation ids to their identity; ``tool_results``
    holds each completed invocation's result until its transcript projection.
    ``transcript`` (the conversation's messages) and ``usage`` (one provider
    usage report per response) only grow (:data:`GROWING`): commands append
    to them; ``context`` is the host's and the runtime's other state.

    Mappings are ``FrozenDict`` (a ``dict``), or ``LayeredDict`` once a
    growing one (intents, tool results, reservations) is long: read them as
    ``Mapping``; :func:`thaw` gives plain ``dict``/``list`` data, and
    ``kernel.dumps`` encodes either as is.
    """

    run_id: str = attrs.field(validator=_run_id)
    incarnation: int = attrs.field(default=1, validator=_positive)
    revision: int = attrs.field(default=0, validator=_non_negative)
    state: str = attrs.field(default="queued", validator=_state)
    admitted: bool = attrs.field(default=False, validator=_bool)
    deadline: float | None = attrs.field(default=None, validator=_optional_time)
    budget: Budget = attrs.field(factory=lambda: Budget(quota=100), validator=_budget)
    step_id: str | None = attrs.field(default=None, validator=_optional_str)
    counters: Mapping[str, int] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    active_provider: Mapping[str, Any] | None = attrs.field(
        default=None, converter=_optional_mapping
    )
    active_tools: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    intents: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    tool_results: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    provider_result: Mapping[str, Any] | None = attrs.field(
        default=None, converter=_optional_mapping
    )
    active_wait: Mapping[str, Any] | None = attrs.field(default=None, converter=_optional_mapping)
    dependencies: tuple[str, ...] = attrs.field(default=(), converter=tuple, validator=_str_tuple)
    children: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    stop_reason: str | None = attrs.field(default=None, validator=_optional_str)
    cleanup_required: Mapping[str, Any] | None = attrs.field(
        default=None, converter=_optional_mapping
    )
    outcome: Mapping[str, Any] | None = attrs.field(default=None, converter=_optional_mapping)
    context: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    transcript: FrozenList = attrs.field(default=_EMPTY_LIST, converter=_frozen_list)
    usage: FrozenList = attrs.field(default=_EMPTY_LIST, converter=_frozen_list)
    schema_version: int = attrs.field(default=SCHEMA_VERSION, validator=_positive)

    @classmethod
    def new(
        cls,
        run_id: str,
        *,
        incarnation: int = 1,
        work: int = 100,
        context: Mapping[str, Any] | None = None,
        transcript: Any = None,
    ) -> RunRecord:
        """A fresh ``queued`` run at revision 0 (``transcript``: the messages
        it starts from)."""
        if context is not None:
            if not isinstance(context, Mapping):
                raise Error(
                    ErrorClass.VALIDATION,
                    "run context must be a mapping",
                    {"type": type(context).__name__},
                )
            check_json(dict(context), "run context")
        return cls(
            run_id=run_id,
            incarnation=incarnation,
            budget=Budget(quota=work),
            context=context,
            transcript=transcript,
        )

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def conversation(self) -> Mapping[str, Any] | None:
        """The conversation state checkpointed in ``context["conversation"]``,
        with the record's ``transcript`` as its ``"messages"`` and its
        ``usage`` as ``"usage"``; ``None`` before any checkpoint."""
        value = self.context.get("conversation")
        if type(value) is not FrozenDict and not isinstance(value, Mapping):
            return None
        merged = FrozenDict(value)
        dict.__setitem__(merged, "messages", self.transcript)
        dict.__setitem__(merged, "usage", self.usage)
        return merged


def _input(value: Any) -> Mapping[str, Any]:
    t = type(value)  # exact types first: an ABC isinstance check costs ~0.4 us
    if t is FrozenDict:  # frozen already (the engine builds its inputs so)
        return value  # type: ignore[no-any-return]
    if value is None:
        return _EMPTY
    if t is not dict and not isinstance(value, Mapping):
        raise Error(ErrorClass.VALIDATION, "command input must be a mapping")
    return freeze(value)  # type: ignore[no-any-return]


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
    (a ``FrozenDict`` of scalars and frozen values): no walk.  The C
    accelerator derives a ``FrozenDict`` or a ``LayeredDict`` (str keys)
    exactly as this code does, lineage included."""
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


def is_time(value: Any) -> bool:
    """Whether ``value`` is a time a command or an event may carry: a finite
    ``float``, or an ``int`` of magnitude at most 2**53 (a double holds it
    exactly: SQL stores keep event times as doubles)."""
    if type(value) is float:
        return value - value == 0.0
    return type(value) is int and -_EXACT_INT <= value <= _EXACT_INT


#: The largest magnitude of an int a double holds exactly.
_EXACT_INT: Final = 2**53


def _at(instance: Any, attribute: Any, value: Any) -> None:
    if not is_time(value):
        raise Error(
            ErrorClass.VALIDATION,
            "command time must be a finite number (an int of at most 2**53 in magnitude)",
        )


@final
@attrs.frozen
class Command:
    """A request to change a run: ``kind``, the time ``at`` (the caller's clock;
    the kernel never reads one, KER-01) and JSON ``input``."""

    kind: str
    at: float = attrs.field(validator=_at)
    input: Mapping[str, Any] = attrs.field(default=None, converter=_input)


@final
@attrs.frozen
class RunEvent:
    """``"run.<command>"`` with ``{"state", "input"}``; the store assigns ``sequence``."""

    type: str
    occurred_at: float
    payload: Mapping[str, Any] = attrs.field(converter=_frozen_mapping)
    sequence: int | None = None


_EVENT_SETTERS: Final = _slot_setters(RunEvent)
_set_event_type: Final = _EVENT_SETTERS["type"]
_set_event_at: Final = _EVENT_SETTERS["occurred_at"]
_set_event_payload: Final = _EVENT_SETTERS["payload"]
_set_event_sequence: Final = _EVENT_SETTERS["sequence"]


def kernel_event(type_: str, occurred_at: float, payload: FrozenDict) -> RunEvent:
    """A ``RunEvent`` the kernel built from values it checked (a frozen
    payload, a command's time): set slot by slot, no converter run."""
    event: RunEvent = object.__new__(RunEvent)
    _set_event_type(event, type_)
    _set_event_at(event, occurred_at)
    _set_event_payload(event, payload)
    _set_event_sequence(event, None)
    return event


_RECORD_FIELDS: Final = {field.name: field for field in attrs.fields(RunRecord)}


_SETTERS: Final = _slot_setters(RunRecord)


def _make_copy() -> Any:
    """A straight-line copy of a ``RunRecord`` (no loop, no lookup by name):
    the record's slots are set on a blank instance, validators not re-run."""
    namespace: dict[str, Any] = {f"set_{name}": setter for name, setter in _SETTERS.items()}
    lines = ["def _copy_record(record, new_object, cls):", "    new = new_object(cls)"]
    lines += [f"    set_{name}(new, record.{name})" for name in _RECORD_FIELDS]
    lines.append("    return new")
    exec("\n".join(lines), namespace)  # code built from our own field names only
    return namespace["_copy_record"]


def _pick_copy() -> Callable[[Any], Any]:
    """``_copy_record(record)``: the C accelerator's slot copy when it copies
    a ``RunRecord`` on this interpreter (it refuses a type whose state it
    would not all copy), else the Python one."""
    python_copy = functools.partial(_make_copy(), new_object=object.__new__, cls=RunRecord)
    if _accelerator is None:  # pragma: no cover - exercised where no compiler was available
        return python_copy
    copy_slots = _accelerator.copy_slots
    probe = RunRecord(run_id="probe")
    try:
        copied = copy_slots(probe)
    except TypeError:  # pragma: no cover - an interpreter laying slots out otherwise
        return python_copy
    return copy_slots if copied == probe else python_copy


_copy_record: Final = _pick_copy()


#: Per field, the exact types its converter returns as they are: a frozen
#: mapping given to a mapping field is kept without calling the converter.
_MAPPING_AS_IS: Final[dict[Any, frozenset[type]]] = {
    _frozen_mapping: frozenset({FrozenDict, LayeredDict}),
    _optional_mapping: frozenset({FrozenDict, LayeredDict, type(None)}),
    _frozen_list: frozenset({FrozenList}),
}
_AS_IS: Final = {
    name: _MAPPING_AS_IS.get(field.converter, frozenset()) for name, field in _RECORD_FIELDS.items()
}


#: Per field: its slot setter, the types its converter keeps as they are,
#: its converter and its validator (``None`` when it has none), and itself.
_FIELD_OPS: Final[dict[str, tuple[Any, frozenset[type], Any, Any, Any]]] = {
    name: (_SETTERS[name], _AS_IS[name], field.converter, field.validator, field)
    for name, field in _RECORD_FIELDS.items()
}


def evolve_record(record: RunRecord, **changes: Any) -> RunRecord:
    """``attrs.evolve`` for the hot path: copies the record and runs the
    converter and validator of the changed fields only (the others were
    checked when ``record`` was built)."""
    return evolved(record, changes)


def evolved(record: RunRecord, changes: Mapping[str, Any]) -> RunRecord:
    """:func:`evolve_record` of a mapping of changes (the kernel's handlers
    return one: no keyword arguments to build again)."""
    new: RunRecord = _copy_record(record)
    for name, given in changes.items():
        # KeyError: an unknown field is a bug
        setter, as_is, converter, validator, field = _FIELD_OPS[name]
        value = given if converter is None or type(given) in as_is else converter(given)
        setter(new, value)
        if validator is not None:
            validator(new, field, value)
    return new
