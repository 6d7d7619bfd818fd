"""``StoreConformance``: the checks every durable store must pass.

Subclass it in a test module and provide the factory hooks::

    class TestMyStore(trio_backplane.testing.StoreConformance):
        async def make_store(self) -> Store: ...          # a fresh, empty store
        async def reopen(self, store: Store) -> Store: ...  # a new instance, same data
        async def fail_next_commit(self, store: Store) -> None: ...

pytest (with pytest-trio) collects every ``test_*`` check of the subclass.
Each check drives real kernel transitions, commits them, reopens the store
and asserts what ``load``, ``events`` and ``list_runs`` return.  Each check
first requires a durable store: one whose ``fence`` raises
``unsupported_capability`` (``MemoryStore``) makes every check fail with
``Error(unsupported_capability, "durable store required")`` (STO-12).

The module imports neither pytest nor any store: hosts ship it with their
own stores.  A check is a plain coroutine method, so it can also be run
directly (``trio.run(TestMyStore().test_atomic_commit)``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from ._further import _FurtherChecks
from ._sto11 import STO_11_CHECKS, _Sto11Checks
from ._support import _mark_trio

__all__ = ["STO_11_CHECKS", "StoreConformance"]


class StoreConformance(_Sto11Checks, _FurtherChecks):
    """The durable store conformance suite (STO-11, STO-12).

    Subclasses provide :meth:`make_store`, :meth:`reopen` and
    :meth:`fail_next_commit`; they may override :meth:`close_store` (the
    default awaits ``store.aclose()`` when the store has one).  Every store a
    check obtains from the hooks is closed when the check ends.
    """

    __test__: ClassVar[bool] = False
    STO_11_CHECKS: ClassVar[tuple[str, ...]] = STO_11_CHECKS

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The base is not collected; its subclasses are, unless private
        # (``_Name``) or explicitly ``__test__ = False`` themselves.
        if "__test__" not in cls.__dict__:
            cls.__test__ = not cls.__name__.startswith("_")
        _mark_trio(cls)
