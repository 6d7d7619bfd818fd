"""``ScriptedProvider``: replays scripted responses, for tests, demos and benchmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, final

import attrs
import trio

from ..errors import Error, ErrorClass
from ..runtime._provider import (
    ProviderEvent,
    ProviderRequest,
    ResponseCompleted,
    ResponseFailed,
    TextDelta,
    ToolCallCompleted,
    Usage,
)

__all__ = ["Hang", "Raise", "ScriptedProvider", "Sleep"]


@final
@attrs.frozen
class Hang:
    """Script step: block forever (until cancelled)."""


@final
@attrs.frozen
class Sleep:
    """Script step: sleep ``seconds`` (Trio time, so MockClock applies)."""

    seconds: float


@final
@attrs.frozen
class Raise:
    """Script step: raise ``exception`` mid-stream."""

    exception: BaseException


Step = Any  # a ProviderEvent, Hang, Sleep, Raise, or any object (to test PRV-06)


def _response(steps: Any) -> list[Step]:
    """One scripted response: a list or tuple of steps."""
    if not isinstance(steps, list | tuple):
        raise Error(
            ErrorClass.VALIDATION,
            "a scripted response is a list of steps",
            {"type": type(steps).__name__},
        )
    return list(steps)


class ScriptedProvider:
    """Each ``stream`` call replays the next scripted response.

    A response is a sequence of steps; the helpers build the usual ones.
    ``requests`` records every request (without the trusted context) and
    ``contexts`` what context each call received.
    """

    def __init__(self, responses: Iterable[Sequence[Step]] = ()) -> None:
        if isinstance(responses, str | bytes | Mapping) or not isinstance(responses, Iterable):
            raise Error(
                ErrorClass.VALIDATION,
                "responses must be a list of scripted responses (lists of steps)",
                {"type": type(responses).__name__},
            )
        self._responses = [_response(r) for r in responses]
        self.requests: list[ProviderRequest] = []
        self.contexts: list[Any] = []
        self.closed = 0

    def add(self, *responses: Sequence[Step]) -> None:
        self._responses.extend(_response(r) for r in responses)

    @property
    def remaining(self) -> int:
        return len(self._responses)

    def stream(
        self, request: ProviderRequest, context: Mapping[str, Any] | None
    ) -> AsyncIterator[ProviderEvent]:
        self.requests.append(request)
        self.contexts.append(context)
        if not self._responses:
            raise Error(ErrorClass.EXECUTION_FAILURE, "scripted provider has no response left")
        return self._play(self._responses.pop(0))

    async def _play(self, steps: list[Step]) -> AsyncIterator[ProviderEvent]:
        try:
            for step in steps:
                await trio.lowlevel.checkpoint()
                if isinstance(step, Hang):
                    await trio.sleep_forever()
                elif isinstance(step, Sleep):
                    await trio.sleep(step.seconds)
                elif isinstance(step, Raise):
                    raise step.exception
                else:
                    yield step
        finally:
            self.closed += 1

    # -- builders -------------------------------------------------------------

    @staticmethod
    def text(text: str, *, usage: Mapping[str, Any] | None = None) -> list[Step]:
        """A plain text response, streamed as one delta."""
        return [
            TextDelta(text),
            ResponseCompleted({"role": "assistant", "content": text}, usage=usage),
        ]

    @staticmethod
    def tool_calls(
        *calls: tuple[str, str, Any], text: str = "", streamed: bool = True
    ) -> list[Step]:
        """A response that calls tools: ``(tool_call_id, name, arguments)`` each."""
        steps: list[Step] = []
        blocks: list[dict[str, Any]] = []
        if text:
            steps.append(TextDelta(text))
            blocks.append({"type": "text", "text": text})
        for call_id, name, arguments in calls:
            if streamed:
                steps.append(ToolCallCompleted(call_id, name, arguments))
            blocks.append(
                {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}
            )
        steps.append(ResponseCompleted({"role": "assistant", "content": blocks}))
        return steps

    @staticmethod
    def usage(usage: Mapping[str, Any]) -> Usage:
        return Usage(usage)

    @staticmethod
    def failure(error: Error) -> list[Step]:
        return [ResponseFailed(error)]
