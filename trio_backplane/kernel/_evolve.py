"""``evolved(record, changes)``: a copy of a record with some fields changed,
checking only those (the transition's hot path)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ._fields import _frozen_list, _frozen_mapping, _optional_mapping, _slot_setters
from ._frozen import FrozenDict, FrozenList, LayeredDict, _accelerator
from ._records import RunRecord

__all__ = ["evolve_record", "evolved"]


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
