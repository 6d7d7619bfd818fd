"""Record constructors without attrs' ``__init__`` (the C accelerator's).

A frozen slotted attrs class stores each argument through
``object.__setattr__``: about 600 instructions a field, 18,000 for the
fifteen of a ``ToolOperation``, built for every tool call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final, ParamSpec, TypeVar, cast

import attrs

from ._frozen import _accelerator

__all__ = ["fast_constructor"]

P = ParamSpec("P")
T = TypeVar("T")

_HOOKS = ("__attrs_pre_init__", "__attrs_post_init__", "__attrs_init__")

_TYPE_CALL: Final[Any] = type.__call__
_OBJECT_NEW: Final[Any] = object.__new__
_VARARGS: Final = 0x04  # (code flags: *args, **kwargs)
_VARKEYWORDS: Final = 0x08

#: the constructor made for each registered class
_made: dict[Any, Callable[..., Any]] = {}


def fast_constructor(cls: Callable[P, T]) -> Callable[P, T]:
    """A callable making what ``cls(*args, **fields)`` makes: for a slotted
    attrs class whose ``__init__`` only stores its arguments (no validator,
    converter, factory, hook or cached hash), the accelerator copies a blank
    instance holding the defaults and sets the arguments; a call it cannot
    build exactly so (any error among them) is the call of ``cls`` itself.
    Any other class, or no accelerator: ``cls`` itself.  The same callable
    for a class on every call; a registered class stays registered for the
    life of the process (for classes defined once, at module level)."""
    made = _made.get(cls)
    if made is not None:
        return made
    spec = _spec(cls)
    if spec is None or _accelerator is None:
        return cls
    blank, fields, positional = spec
    try:
        _accelerator.register_record(cls, blank, fields, positional)
    except TypeError:  # a layout the accelerator refuses, or its 32 classes taken
        _made[cls] = cls
        return cls
    # The C function bound to the class, no Python frame around it (a frame
    # costs what a small record's __init__ does).
    made = _made[cls] = functools.partial(_accelerator.record, cls)
    return cast("Callable[P, T]", made)


def _attrs_frozen_guard(setter: Any) -> bool:
    """Whether ``setter`` is the ``__setattr__`` attrs gives a frozen class."""
    return (
        getattr(setter, "__module__", None) == "attr._make"
        and getattr(setter, "__name__", None) == "_frozen_setattrs"
    )


def _spec(cls: Any) -> tuple[Any, tuple[tuple[str, str], ...], int] | None:
    """The blank instance, the ``(keyword, slot)`` pairs in ``__init__``'s
    order and how many are positional; ``None`` for a class whose
    ``__init__`` does more than store its arguments."""
    if not (isinstance(cls, type) and "__attrs_attrs__" in cls.__dict__):
        return None  # (a subclass of an attrs class is not one)
    if any(getattr(cls, hook, None) is not None for hook in _HOOKS):
        return None
    # The call is type.__call__ -> object.__new__ -> attrs' own __init__,
    # which stores through object.__setattr__ (or attrs' frozen guard), and
    # nothing finalizes or forbids an instance.
    init = cls.__dict__.get("__init__")
    code = getattr(init, "__code__", None)
    setter: Any = cls.__setattr__
    if (
        code is None
        or not code.co_filename.startswith("<attrs generated")
        or type(cls).__call__ is not _TYPE_CALL
        or cls.__new__ is not _OBJECT_NEW
        or not (setter is object.__setattr__ or _attrs_frozen_guard(setter))
        or getattr(cls, "__abstractmethods__", None)
        or getattr(cls, "__del__", None) is not None
    ):
        return None
    fields = attrs.fields(cls)
    # Every slot a field's: __init__ sets no hidden state (a cached hash).
    slots = {name for klass in cls.__mro__ for name in klass.__dict__.get("__slots__", ())}
    if slots - {"__weakref__"} != {f.name for f in fields}:
        return None
    for field in fields:
        if (
            not field.init
            or field.validator is not None
            or field.converter is not None
            or isinstance(field.default, attrs.Factory)  # type: ignore[arg-type]
        ):
            return None
    positional = [f for f in fields if not f.kw_only]
    ordered = positional + [f for f in fields if f.kw_only]
    # What __init__ takes, read from its code rather than assumed: self, the
    # positional fields, then the keyword-only ones, nothing variadic.
    if code.co_flags & (_VARARGS | _VARKEYWORDS):
        return None
    taken = code.co_argcount - 1
    names = code.co_varnames[1 : 1 + taken + code.co_kwonlyargcount]
    if taken != len(positional) or names != tuple(f.alias for f in ordered):
        return None
    blank: Any = object.__new__(cls)
    for field in fields:
        if field.default is not attrs.NOTHING:
            object.__setattr__(blank, field.name, field.default)
    pairs = tuple((f.alias, f.name) for f in ordered)
    return blank, pairs, len(positional)
