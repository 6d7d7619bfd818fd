"""A nursery that owns its tasks: the body's exception unwrapped, the
tasks' failures as one classed ``Error``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ..errors import Error, ErrorClass, exception_leaves

__all__ = ["owning_nursery"]


@asynccontextmanager
async def owning_nursery(failed: str) -> AsyncIterator[trio.Nursery]:
    """A nursery whose body's own exception propagates unchanged; anything
    of its tasks surfaces as one ``Error`` (``failed`` its message when
    there are several; Cancelled, KeyboardInterrupt and SystemExit as
    they are)."""
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:
                yield nursery
            except BaseException as exc:
                body_error = exc
                raise
    except BaseExceptionGroup as group:
        leaves = exception_leaves(group)
        if body_error is not None:
            # The body's own exception (a group of the host's included), alone:
            # it propagates unchanged, not wrapped by this nursery.
            mine = {id(leaf) for leaf in exception_leaves(body_error)}
            if all(id(leaf) in mine for leaf in leaves):
                raise body_error from None
        error = _surface(leaves, failed)
        if isinstance(error, Error):
            raise error from group
        raise error from None


def _surface(flat: list[BaseException], failed: str) -> BaseException:
    """Cancelled, KeyboardInterrupt and SystemExit propagate unchanged;
    anything else surfaces as one ``Error`` chained from the group."""
    for kind in (KeyboardInterrupt, SystemExit, trio.Cancelled):
        for item in flat:
            if isinstance(item, kind):
                return item
    errors = [e for e in flat if isinstance(e, Error)]
    if len(errors) == 1 and len(flat) == 1:
        return errors[0]
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        failed,
        {"errors": [f"{type(e).__name__}: {e}"[:300] for e in flat][:10]},
    )
