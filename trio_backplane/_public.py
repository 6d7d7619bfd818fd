"""What makes the public surface what it says: public module paths and
classes only the library constructs (the way trio does both)."""

from __future__ import annotations

import types
from typing import Any, TypeVar

import attrs

__all__ = ["NoPublicConstructor", "fixup_module_metadata"]

_T = TypeVar("_T")


class NoPublicConstructor(type):
    """A metaclass for classes that only the library constructs: calling the
    class raises ``TypeError``; the library calls ``cls._create(...)``."""

    def __call__(cls, *args: object, **kwargs: object) -> None:
        raise TypeError(
            f"{cls.__module__}.{cls.__qualname__} has no public constructor"
            " (open_conversation() makes one)"
        )

    def _create(cls: type[_T], *args: object, **kwargs: object) -> _T:
        return super().__call__(*args, **kwargs)  # type: ignore[misc, no-any-return]


def fixup_module_metadata(module_name: str, namespace: dict[str, Any]) -> None:
    """Give every class and function ``namespace["__all__"]`` names (and the
    methods of those classes) ``module_name`` as ``__module__``: reprs, pickles,
    tracebacks and the docs then name the path a user imports, not a private
    module.  Only objects of this package are touched; the top level runs
    after its sub-namespaces, so a name it re-exports ends up its own."""
    seen: set[int] = set()

    def fix(obj: Any) -> None:
        if id(obj) in seen or not isinstance(obj, type | types.FunctionType):
            return
        seen.add(id(obj))
        if not getattr(obj, "__module__", "").startswith("trio_backplane."):
            return
        obj.__module__ = module_name
        if isinstance(obj, type):
            for value in vars(obj).values():
                fix(getattr(value, "__func__", value))

    # cattrs and typing resolve string annotations in the module named by
    # ``__module__`` (a subclass's in each base's): resolve every class's
    # while all of them still name their defining one.
    for name in namespace["__all__"]:
        obj = namespace[name]
        own = getattr(obj, "__module__", "").startswith("trio_backplane.")
        if own and isinstance(obj, type) and attrs.has(obj):
            attrs.resolve_types(obj)
    for name in namespace["__all__"]:
        fix(namespace[name])
