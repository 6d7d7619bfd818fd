from typing import Any

def configure(frozen_dict: type, frozen_list: type, layered_dict: type, /) -> None:
    """The types ``freeze`` builds and keeps as they are."""

def freeze(value: object, limit: int, /) -> Any:
    """The frozen copy of JSON data of exact built-in types, or ``NotImplemented``."""

def copy_slots(obj: object, /) -> Any:
    """A new instance of ``type(obj)`` with the same slot values (no ``__init__`` run)."""

def grown(items: list[Any] | tuple[Any, ...], more: list[Any] | tuple[Any, ...], /) -> Any:
    """A new ``FrozenList`` of the items of ``items``, then those of ``more``."""
