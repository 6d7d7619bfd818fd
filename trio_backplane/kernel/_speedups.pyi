from typing import Any

def configure(
    frozen_dict: type, frozen_list: type, layered_dict: type, lineage_max: int, /
) -> None:
    """The types ``freeze`` builds and keeps as they are."""

def freeze(value: object, limit: int, /) -> Any:
    """The frozen copy of JSON data of exact built-in types, or ``NotImplemented``."""

def copy_slots(obj: object, /) -> Any:
    """A new instance of ``type(obj)`` with the same slot values (no ``__init__`` run)."""

def grown(items: list[Any] | tuple[Any, ...], more: list[Any] | tuple[Any, ...], /) -> Any:
    """A new ``FrozenList`` of the items of ``items``, then those of ``more``."""

def put(mapping: object, key: object, value: object, layer_from: int, overlay_max: int, /) -> Any:
    """``_derived.put`` for a ``FrozenDict`` or a ``LayeredDict``, or ``NotImplemented``."""

def configure_transition(
    record_type: type,
    budget_type: type,
    event: object,
    unset: object,
    key_summaries: dict[Any, Any],
    item_summaries: tuple[Any, ...],
    max_depth: int,
    record_depth: int,
    commands: tuple[tuple[type, str, tuple[tuple[str, bool], ...]], ...],
    /,
) -> None:
    """The kernel's types, helpers and command layouts ``transition`` works with."""

def transition(
    record: object, command: object, revision: int | None, layer_from: int, overlay_max: int, /
) -> Any:
    """``_transition.transition`` of a tool step's four commands, or ``NotImplemented``."""

def configure_commands(
    specs: tuple[tuple[type, object, tuple[tuple[str, bool], ...]], ...], /
) -> None:
    """The command classes ``command`` builds, each with its blank instance and fields."""

def command(cls: type, at: object, fields: object, /) -> Any:
    """``cls(at=at, **fields)`` for a configured command class, or ``NotImplemented``."""

def register_record(
    cls: type, blank: object, fields: tuple[tuple[str, str], ...], positional: int, /
) -> None:
    """A class ``record`` builds: its blank, ``(keyword, slot)`` pairs, how many by position."""

def record(cls: type, /, *args: object, **fields: object) -> Any:
    """``cls(*args, **fields)``, built as a copy of a registered class's blank instance."""

def dumps(value: object, /) -> Any:
    """``_json.dumps`` of JSON data whose every str is ASCII, or ``NotImplemented``."""

def configure_head(
    type: type,
    budget_type: type,
    names: tuple[str, ...],
    kinds: tuple[int, ...],
    keys: tuple[str, ...],
    fixed: tuple[str | None, ...],
    budget: tuple[str, str, str],
    fallback: Any,
    /,
) -> None:
    """The record type ``head_fields`` encodes, and how each of its fields is written."""

def head_fields(record: object, previous: object, fields: object, /) -> Any:
    """``_layout.head_fields`` of a configured record type, or ``NotImplemented``."""

def configure_diff(
    entry_type: type,
    keyed_type: type,
    record_type: type,
    budget_type: type,
    parts: tuple[str, str, str],
    lists: tuple[str, str],
    make_entry: Any,
    encode: Any,
    /,
) -> None:
    """The types and helpers ``diff`` works with."""

def diff(entry: object, record: object, /) -> Any:
    """``_diff.diff`` of the common commit ``(entry, upserts, deletes)``, or ``NotImplemented``."""

def commit_checked(
    record_type: type,
    event_type: type,
    max_run_id: int,
    max_int: int,
    exact_int: int,
    run_id: object,
    incarnation: object,
    expected_revision: object,
    record: object,
    events: object,
    /,
) -> bool:
    """Whether a store commit's arguments certainly pass the store's checks
    (``False``: run them)."""
