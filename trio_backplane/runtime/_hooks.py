"""The host's hooks, called within ``effect_timeout``; whatever they do wrong
comes back classed (a hook is host code: its bugs are contained)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, final

import attrs
import trio

from ..errors import Error, ErrorClass
from ..kernel import freeze, thaw
from ._input import check_content, check_user_message
from ._signals import _Rejected
from ._state import Publisher, RunState
from ._types import Continue, HookContext

__all__ = ["HookRunner"]


def _failed(what: str, exc: Exception) -> Error:
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        f"{what} failed",
        {"cause": f"{type(exc).__name__}: {exc}"[:500]},
    )


@final
class HookRunner:
    """Calls ``hooks.prompt`` and ``hooks.stop`` when the host gave them."""

    __slots__ = ("_hooks", "_publisher", "_state", "_timeout")

    def __init__(self, state: RunState, publisher: Publisher, hooks: Any, timeout: float) -> None:
        self._state = state
        self._publisher = publisher
        self._hooks = hooks
        self._timeout = timeout

    async def prompt(self, message: dict[str, Any], mode: str, turn_id: str) -> Any:
        """The message as the prompt hook rewrote it (its id kept); a refusal
        is published as ``prompt_rejected`` and raised as ``_Rejected``."""
        hook = getattr(self._hooks, "prompt", None)
        if hook is None:
            return message
        context = HookContext(self._state.run_id, self._state.record.incarnation, turn_id, mode)  # type: ignore[arg-type]
        message_id = message["id"]  # the message's id, whatever the hook does to it
        refusal: Error | None = None
        result: Any = None
        try:
            # (cancel_called, not a TooSlowError: a hook that ignores its
            # cancellation and returns late has timed out too, API.md)
            with trio.move_on_after(self._timeout) as bound:
                result = await hook(dict(message), context)
            if bound.cancel_called:
                refusal = Error(ErrorClass.TIMEOUT, "prompt hook timed out")
        except Error as exc:
            refusal = exc
        except Exception as exc:  # a bug in the host's hook: reported, classed, contained
            refusal = _failed("prompt hook", exc)
        if refusal is None:
            try:
                # committed as the message: JSON data, a user message whose
                # content is what a prompt may hold
                result = check_user_message(freeze(result, "prompt hook result"))
            except Error as exc:
                refusal = Error(
                    ErrorClass.VALIDATION,
                    "prompt hook must return a user message",
                    {"cause": exc.message},
                )
        if refusal is not None:
            event = self._publisher.event(
                "prompt_rejected", {"message_id": message_id, "error": refusal.to_dict()}
            )
            # The rejected message belongs to ``turn_id``, even before
            # any checkpoint names that turn.
            self._publisher.hub.publish(attrs.evolve(event, turn_id=turn_id))
            raise _Rejected(refusal)
        return {**result, "id": message_id}

    async def stop(self, turn_id: str, message: Mapping[str, Any]) -> Any:
        """The stop hook's verdict: ``None`` (stop: no hook, or ``"stop"``) or
        the checked content of a ``Continue``; anything else raises a classed
        ``Error`` (the turn fails)."""
        hook = getattr(self._hooks, "stop", None)
        if hook is None:
            return None
        context = HookContext(self._state.run_id, self._state.record.incarnation, turn_id, "stop")
        try:
            # (a hook that ignores its cancellation and returns late has
            # timed out too, API.md)
            with trio.move_on_after(self._timeout) as bound:
                result = await hook({"turn_id": turn_id, "message": thaw(message)}, context)
        except Error:
            raise
        except Exception as exc:  # a bug in the host's hook: the turn fails, classed
            raise _failed("stop hook", exc) from None
        if bound.cancel_called:
            raise Error(ErrorClass.TIMEOUT, "stop hook timed out")
        if type(result) is str and result == "stop":  # never a host object's __eq__
            return None
        if isinstance(result, Continue):
            return check_content(result.message)
        raise Error(
            ErrorClass.VALIDATION, "invalid stop hook result", {"type": type(result).__name__}
        )
