"""One provider attempt's events in, its response out: sans-I/O, like h11.

:class:`ResponseAssembler` does what an attempt's events mean: output
accounting, tool-call assembly, usage, the terminal event and the checks of what a
provider may put in a response.  It reads no clock, awaits nothing and
publishes nothing: ``feed`` returns the transient event to publish, and the
Trio side (``_responses.Responses``) keeps the scopes, the closing and
the commits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, final

import attrs

from ..errors import Error, ErrorClass
from ..kernel import FrozenDict, freeze, thaw, utf8_size
from ..kernel._construct import fast_constructor
from ._provider import (
    PROVIDER_EVENTS,
    ResponseCompleted,
    ResponseFailed,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
    Usage,
)

__all__ = ["AttemptOutcome", "ResponseAssembler", "tool_calls"]

#: A transient event to publish: ``(type, payload)``.
Publication = tuple[str, dict[str, Any]]


@final
@attrs.frozen(kw_only=True)
class AttemptOutcome:
    """What an attempt produced once its stream ended: the response and its
    tool calls, or the failure that fails the turn; usage either way."""

    message: Mapping[str, Any] | None
    calls: list[dict[str, Any]]
    usage: list[Any]
    failure: Error | None
    #: the calls came from the stream, not from the message's blocks: the
    #: committed result must name them (a resumed run reads them there)
    streamed_calls: bool = False


# One an attempt: without attrs' __init__ (see fast_constructor).
_outcome: Final = fast_constructor(AttemptOutcome)


class _Accounting:
    """Provider output per attempt: each block counts once, as the
    larger of its summed deltas and its largest snapshot."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.deltas: dict[Any, int] = {}
        self.snapshots: dict[Any, int] = {}
        #: the sum over keys of max(deltas, snapshot), kept as they change:
        #: an event costs its own key, not a walk of every block so far
        self.total = 0

    def add(self, key: Any, *, delta: int = 0, snapshot: int = 0) -> None:
        deltas = self.deltas.get(key, 0)
        largest = self.snapshots.get(key, 0)
        before = max(deltas, largest)
        if delta:
            deltas = self.deltas[key] = deltas + delta
        if snapshot > largest:
            largest = self.snapshots[key] = snapshot
        self.total += max(deltas, largest) - before
        size = self.total
        if size > self.limit:
            raise Error(
                ErrorClass.RESOURCE_CONFLICT,
                "provider output limit exceeded",
                {"scope": "provider_response", "size": size, "limit": self.limit},
            )


@final
class ResponseAssembler:
    """Feed it an attempt's provider events in order; ask for the outcome when
    the stream ends.  ``feed`` raises ``Error`` when an event breaks the
    response (over the output limit, not JSON data): the attempt failed."""

    def __init__(self, output_limit: float) -> None:
        self._accounting = _Accounting(output_limit)
        self._usage: list[Any] = []
        self._completed: list[dict[str, Any]] = []
        self._message: Mapping[str, Any] | None = None
        #: a terminal event ended the response
        self.terminal = False
        #: why the attempt failed, once it has
        self.failure: Error | None = None

    @property
    def done(self) -> bool:
        """Nothing more is read from the stream."""
        return self.terminal or self.failure is not None

    def fail(self, error: Error) -> None:
        """The stream itself failed (raised, or could not be read)."""
        self.failure = error

    def feed(self, event: Any) -> Publication | None:
        """Take one event; the transient event to publish for it, if any."""
        handler = _HANDLERS.get(type(event))  # the event classes are final
        if handler is None:
            self.failure = Error(
                ErrorClass.VALIDATION,
                "unsupported normalized provider event",
                {"type": type(event).__name__},
            )
            return None
        return handler(self, event)

    def outcome(self) -> AttemptOutcome:
        """The attempt's outcome, once the stream has ended."""
        failure, message, usage = self.failure, self._message, self._usage
        if failure is None and not self.terminal:
            failure = Error(ErrorClass.VALIDATION, "provider ended without terminal event")
        if failure is None and (
            (type(message) is not FrozenDict and not isinstance(message, Mapping))
            or message.get("role") != "assistant"
        ):
            failure = Error(ErrorClass.VALIDATION, "provider message role must be assistant")
        if usage:
            try:  # frozen once, here: appending them then costs no walk
                usage = list(freeze(usage, "provider usage"))
            except Error as error:
                usage = []  # reports that are not JSON data are dropped, never stored
                failure = failure or _not_json("usage", error)
        calls: list[dict[str, Any]] = []
        if failure is None:
            assert message is not None
            calls = tool_calls(message, self._completed)
            failure = _malformed_call(calls)
        return _outcome(
            message=message,
            calls=calls,
            usage=usage,
            failure=failure,
            streamed_calls=bool(calls) and calls is self._completed,
        )

    def _response_completed(self, event: ResponseCompleted) -> None:
        self.terminal = True
        # copied first: what is checked and counted is what is committed,
        # whatever the provider's own object does afterwards
        try:
            message = freeze(event.message, "provider response")
        except Error as error:
            self.failure = _not_json("response", error)
            return
        self._message = message
        if type(message) is FrozenDict or isinstance(message, Mapping):
            try:
                _account_content(self._accounting, message)
            except (TypeError, ValueError, RecursionError) as exc:  # sizes of what is not JSON
                raise _unsized("response", exc) from None
        if event.usage is not None:
            self._usage.append(thaw(event.usage))

    def _response_failed(self, event: ResponseFailed) -> None:
        self.terminal = True
        self.failure = _provider_error(event.error)

    def _text(self, event: TextDelta) -> Publication:
        self._accounting.add(("text", event.index), delta=utf8_size(event.text))
        return "content_text_delta", {"delta": event.text, "index": event.index}

    def _thinking(self, event: ThinkingDelta) -> Publication:
        self._accounting.add(("thinking", event.index), delta=utf8_size(event.text))
        return "content_thinking_delta", {"delta": event.text, "index": event.index}

    def _call_started(self, event: ToolCallStarted) -> Publication:
        call = {"id": event.tool_call_id, "name": event.name, "index": event.index}
        return "tool_call_started", {"tool_call": call}

    def _call_arguments(self, event: ToolCallArgumentsDelta) -> Publication:
        self._accounting.add(("tool", event.tool_call_id), delta=utf8_size(event.delta))
        payload = {"delta": event.delta, "index": event.index}
        return "tool_call_arguments_delta", {**payload, "tool_call_id": event.tool_call_id}

    def _call_completed(self, event: ToolCallCompleted) -> Publication:
        try:
            size = utf8_size(event.arguments)
        except (TypeError, ValueError, RecursionError) as exc:  # sizes of what is not JSON
            raise _unsized("tool call", exc) from None
        self._accounting.add(("tool", event.tool_call_id), snapshot=size)
        completed = {"id": event.tool_call_id, "name": event.name, "arguments": event.arguments}
        self._completed.append(completed)
        return "tool_call_completed", {"tool_call": completed}

    def _usage_report(self, event: Usage) -> Publication:
        self._usage.append(thaw(event.usage))
        return "usage_updated", {"usage": event.usage}


#: what each provider event class does to a response
_HANDLERS: dict[type, Callable[[ResponseAssembler, Any], Publication | None]] = {
    TextDelta: ResponseAssembler._text,
    ThinkingDelta: ResponseAssembler._thinking,
    ToolCallStarted: ResponseAssembler._call_started,
    ToolCallArgumentsDelta: ResponseAssembler._call_arguments,
    ToolCallCompleted: ResponseAssembler._call_completed,
    Usage: ResponseAssembler._usage_report,
    ResponseCompleted: ResponseAssembler._response_completed,
    ResponseFailed: ResponseAssembler._response_failed,
}
assert set(_HANDLERS) == set(PROVIDER_EVENTS)


def _account_content(accounting: _Accounting, message: Mapping[str, Any]) -> None:
    content = message.get("content")
    if isinstance(content, str):
        accounting.add(("text", 0), snapshot=utf8_size(content))
        return
    if not isinstance(content, list | tuple):
        return
    # a block without "index" takes its position among blocks of its own
    # kind, matching TextDelta/ThinkingDelta indexes (both start at 0), so a
    # text block after a thinking block is not counted twice
    positions = {"text": 0, "thinking": 0}
    # Two blocks of this message never share a key: each counts (a message
    # repeating one index or tool call id a thousand times must not pass as
    # one block).
    seen: set[Any] = set()
    for position, block in enumerate(content):
        if type(block) is not FrozenDict and not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "tool_call":
            key: Any = ("tool", block.get("id"))
            size = utf8_size(block.get("arguments"))
        elif kind in ("text", "thinking"):
            key = (kind, block.get("index", positions[kind]))
            size = utf8_size(block.get(kind, block.get("text", "")))
            positions[kind] += 1
        else:
            continue
        if key in seen:
            key = (*key, "block", position)
        seen.add(key)
        accounting.add(key, snapshot=size)


def _provider_error(error: Any) -> Error:
    """The classed error a ``ResponseFailed`` carries (a provider that put
    something else there failed all the same, classed)."""
    if isinstance(error, Error):
        return error
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        "provider failed without a classed error",
        {"type": type(error).__name__},
    )


def _unsized(what: str, exc: BaseException) -> Error:
    """A provider ``what`` whose size could not be taken: not JSON data."""
    return Error(
        ErrorClass.VALIDATION,
        f"provider {what} is not JSON data",
        {"cause": f"{type(exc).__name__}: {exc}"[:300]},
    )


def _not_json(what: str, error: Error) -> Error:
    return Error(
        ErrorClass.VALIDATION, f"provider {what} is not JSON data", {"cause": error.message}
    )


def _malformed_call(calls: list[dict[str, Any]]) -> Error | None:
    """A tool call without a str id and name (Unicode text: a streamed call
    was never frozen) cannot be run nor committed."""
    for call in calls:
        if type(call["id"]) is not str or not call["id"] or type(call["name"]) is not str:
            return Error(
                ErrorClass.VALIDATION,
                "provider tool call needs a str id and name",
                {"id": repr(call["id"])[:100], "name": repr(call["name"])[:100]},
            )
        if not (call["id"].isascii() and call["name"].isascii()):
            try:
                freeze((call["id"], call["name"]), "provider tool call")
            except Error as error:
                return _not_json("tool call", error)
    return None


def tool_calls(message: Mapping[str, Any], completed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call blocks of the terminal message are authoritative;
    otherwise the incrementally completed calls, in completion order."""
    content = message.get("content")
    blocks: list[dict[str, Any]] = []
    if isinstance(content, list | tuple):
        for block in content:
            if (type(block) is FrozenDict or isinstance(block, Mapping)) and block.get(
                "type"
            ) == "tool_call":
                blocks.append(
                    {
                        "id": block.get("id"),
                        "name": block.get("name"),
                        "arguments": block.get("arguments"),
                    }
                )
    return blocks if blocks else completed
