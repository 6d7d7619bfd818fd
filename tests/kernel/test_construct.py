"""``fast_constructor``: the C accelerator's record constructor makes what
the class's own ``__init__`` makes, or is that very call.

Each call is made twice, through the fast constructor and through the
class, with hostile argument lists (too many positional arguments, unknown
keywords, a field given twice, a required one missing): both give equal
records whose slots hold the very same objects, or both raise the same
``TypeError``.
"""

from __future__ import annotations

import abc
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_backplane.kernel import _speedups
from trio_backplane.kernel._construct import fast_constructor
from trio_backplane.runtime._attempt import AttemptOutcome
from trio_backplane.runtime._context import ToolOperation
from trio_backplane.runtime._provider import ProviderRequest
from trio_backplane.runtime._types import Event
from trio_backplane.store import Receipt
from trio_backplane.store._diff import Entry
from trio_backplane.tools import Invocation


@attrs.frozen
class Mixed:
    _private: int
    plain: str = "default"
    later: Any = attrs.field(default=None, kw_only=True)
    required_kw: Any = attrs.field(kw_only=True)


@attrs.define
class Mutable:
    a: int
    b: list[int] = attrs.field(default=())  # type: ignore[assignment]


@attrs.frozen(kw_only=True)
class Keywords:
    x: int
    y: int = 2


CLASSES: list[type] = [
    ToolOperation,
    ProviderRequest,
    AttemptOutcome,
    Receipt,
    Invocation,
    Event,
    Entry,
    Mixed,
    Mutable,
    Keywords,
]
FAST = {cls: fast_constructor(cls) for cls in CLASSES}


def _outcome(call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return call(*args, **kwargs)
    except TypeError as exc:
        return ("TypeError", str(exc))


def _keywords(cls: type) -> list[str]:
    return [f.alias for f in attrs.fields(cls)]


@st.composite
def calls(draw: st.DrawFn) -> tuple[type, tuple[Any, ...], dict[str, Any]]:
    cls = draw(st.sampled_from(CLASSES))
    names = _keywords(cls)
    values = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.just(object()))
    positional = tuple(draw(st.lists(values, max_size=len(names) + 1)))
    chosen = draw(st.lists(st.sampled_from([*names, "unknown", "_private"]), unique=True))
    keywords = {name: draw(values) for name in chosen}
    return cls, positional, keywords


def test_fast_constructor_matches_the_class_on_hostile_calls() -> None:
    """Every call the C path cannot build exactly (too many positional
    arguments, unknown, repeated or missing fields) is the class's own call:
    the same error, word for word."""

    @given(calls())
    def check(case: tuple[type, tuple[Any, ...], dict[str, Any]]) -> None:
        cls, args, kwargs = case
        made = _outcome(FAST[cls], args, kwargs)
        expected = _outcome(cls, args, kwargs)
        assert type(made) is type(expected)
        if isinstance(expected, tuple):
            assert made == expected
            return
        if cls.__eq__ is not object.__eq__:  # (an eq=False class, Entry: identity)
            assert made == expected
        for field in attrs.fields(cls):
            assert getattr(made, field.name) is getattr(expected, field.name)

    check()


def test_the_runtime_and_stores_records_are_registered() -> None:
    """The records made on a step's path are built by the accelerator."""
    for cls in (ToolOperation, ProviderRequest, AttemptOutcome, Receipt, Invocation, Event, Entry):
        assert FAST[cls] is not cls, cls


def test_complete_calls_take_the_c_path() -> None:
    """A registered class is built by the accelerator, not by ``__init__``
    (a class whose ``__init__`` counts its calls says so)."""
    calls_made = []

    @attrs.frozen
    class Counted:
        a: int
        b: int = 0

    make = fast_constructor(Counted)
    original = Counted.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        calls_made.append(args)
        original(self, *args, **kwargs)

    Counted.__init__ = counting  # type: ignore[method-assign]
    assert make(1, b=2) == Counted(1, 2)
    assert len(calls_made) == 1  # only the Counted(...) of the comparison
    with pytest.raises(TypeError):
        make()  # declined: the class's own call, which raises
    assert len(calls_made) == 2


@attrs.frozen
class Validated:
    a: int = attrs.field(validator=attrs.validators.instance_of(int))


@attrs.frozen
class Converted:
    a: int = attrs.field(converter=int)


@attrs.frozen
class Factory:
    a: list[int] = attrs.field(factory=list)


@attrs.frozen
class Hooked:
    a: int

    def __attrs_post_init__(self) -> None:
        pass


@attrs.frozen(cache_hash=True)
class Cached:
    a: int


@attrs.frozen(slots=False)
class Dicted:
    a: int


class Plain:
    pass


@attrs.frozen
class Base:
    a: int


class OwnInit(Base):
    """Not an attrs class: its own ``__init__`` runs."""

    __slots__ = ()

    def __init__(self, a: int) -> None:
        super().__init__(a * 2)


@attrs.frozen
class Interned:
    a: int

    def __new__(cls, *args: Any, **kwargs: Any) -> Interned:
        return super().__new__(cls)


class Counting(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, **kwargs)


@attrs.frozen
class Metaclassed(metaclass=Counting):
    a: int


@attrs.define
class Setter:
    a: int

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value * 10)


@attrs.frozen
class Abstract(abc.ABC):
    a: int

    @abc.abstractmethod
    def method(self) -> None: ...


@attrs.frozen
class Finalized:
    a: int

    def __del__(self) -> None:
        pass


@pytest.mark.parametrize(
    "cls",
    [
        Validated,
        Converted,
        Factory,
        Hooked,
        Cached,
        Dicted,
        Plain,
        OwnInit,
        Interned,
        Metaclassed,
        Setter,
        Abstract,
        Finalized,
    ],
)
def test_classes_whose_init_does_more_keep_it(cls: type) -> None:
    """A validator, converter, factory, hook, cached hash, ``__dict__``, a
    subclass's own ``__init__``, a ``__new__``, a metaclass ``__call__``, a
    ``__setattr__``, abstract methods or a finalizer: the constructor is the
    class itself (review of session 23)."""
    assert fast_constructor(cls) is cls


def test_a_class_is_registered_once() -> None:
    """The same constructor on every call; the accelerator refuses a
    second registration."""

    @attrs.frozen
    class Once:
        a: int

    assert fast_constructor(Once) is fast_constructor(Once) is not Once
    with pytest.raises(TypeError, match="registered already"):
        _speedups.register_record(Once, object.__new__(Once), (("a", "a"),), 1)


def test_a_str_subclass_keyword_is_the_class_call() -> None:
    """A keyword of a ``str`` subclass is matched by Python's own call (its
    ``__eq__``), never by its text."""

    class Never(str):
        __hash__ = str.__hash__

        def __eq__(self, other: object) -> bool:
            return False

    make = FAST[Receipt]
    keywords: dict[str, Any] = {Never("revision"): 3}
    with pytest.raises(TypeError):
        Receipt("r", 1, **keywords)
    with pytest.raises(TypeError):
        make("r", 1, **keywords)
