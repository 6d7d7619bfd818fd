"""One response assembled from its chunks, as provider events: text and
reasoning deltas, tool calls by index, usage, then the completion."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import Error, ErrorClass
from ...kernel import loads
from ...runtime import (
    ProviderEvent,
    ProviderRequest,
    ResponseCompleted,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
    Usage,
)
from .._http._aliases import ToolAliases
from .._http._errors import Failed, Reported, malformed, stream_error
from .._http._text import StreamedText, parse_arguments, replace_surrogates, unicode

__all__ = ["ResponseBuilder", "finishes", "parse_chunk"]


class _Call:
    """One tool call assembled from its deltas: the argument fragments kept
    as parts (joined once: appending to one str would copy it each time),
    and streamed as Unicode text (a fragment may split a surrogate pair)."""

    __slots__ = ("fragments", "id", "index", "name", "started", "streamed")

    def __init__(self, index: int) -> None:
        self.index = index
        self.id = ""
        self.name = ""
        self.fragments: list[str] = []
        self.streamed = StreamedText()
        self.started = False

    @property
    def arguments(self) -> str:
        return "".join(self.fragments)


class _Calls(dict[int, _Call]):
    """The calls of a response by index, and the indexes not started yet
    (each new index starts the ones below it: never a scan of every call)."""

    def __init__(self) -> None:
        super().__init__()
        self.unstarted: set[int] = set()


def parse_chunk(data: str) -> Mapping[str, Any]:
    """A chunk's data as a JSON object; an error it reports fails the response."""
    try:
        # Lone surrogates are kept here: text pieces join them (StreamedText).
        chunk = loads(data)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
        raise Failed(malformed("stream chunk is not JSON", data)) from None
    if not isinstance(chunk, Mapping):
        raise Failed(malformed("stream chunk is not a JSON object", type(chunk).__name__))
    error = chunk.get("error")
    if error is not None:  # an object, or a bare message some servers send
        message = error.get("message") if isinstance(error, Mapping) else error
        code = error.get("code") or error.get("type") if isinstance(error, Mapping) else None
        raise Reported(stream_error(message, code))
    return chunk


def finishes(chunk: Mapping[str, Any]) -> bool:
    """Whether ``chunk`` (its events taken) finishes the choice read, index 0."""
    return any(
        isinstance(c, Mapping) and c.get("index", 0) == 0 and c.get("finish_reason")
        for c in chunk.get("choices") or ()
    )


class ResponseBuilder:
    """The events of one response, chunk by chunk, and the completion.

    Only choice 0 is read.  Tool calls are assembled by index; a delta
    without an index continues the last call unless it names a new one.  A
    call starts once its name is known: its arguments begin, the next call
    begins or the response ends.
    """

    def __init__(self, aliases: ToolAliases, request: ProviderRequest) -> None:
        self.aliases = aliases
        self.request = request
        self.calls = _Calls()
        self.text = StreamedText()
        self.thinking = StreamedText()
        #: choice 0's ``finish_reason`` (``None``: none came)
        self.finish_reason: str | None = None

    def events(self, chunk: Mapping[str, Any]) -> list[ProviderEvent]:
        """The events of one chunk; raises ``Failed`` for a malformed one."""
        events: list[ProviderEvent] = []
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            events.append(Usage(replace_surrogates(dict(usage))))
        choices = chunk.get("choices")
        if choices is None:
            choices = []
        if not isinstance(choices, list):
            raise Failed(malformed("chunk choices must be a list", type(choices).__name__))
        for choice in choices:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self.finish_reason = replace_surrogates(reason)[:100]
            delta = choice.get("delta") or {}
            if not isinstance(delta, Mapping):
                raise Failed(malformed("chunk delta must be an object", type(delta).__name__))
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                piece = self.thinking.add(reasoning)
                if piece:
                    events.append(ThinkingDelta(piece))
            content = delta.get("content")
            if isinstance(content, str) and content:
                piece = self.text.add(content)
                if piece:
                    events.append(TextDelta(piece))
            tool_calls = delta.get("tool_calls") or ()
            if not isinstance(tool_calls, list | tuple):
                raise Failed(
                    malformed("chunk tool_calls must be an array", type(tool_calls).__name__)
                )
            for raw in tool_calls:
                events.extend(self._tool_delta(raw))
        return events

    def _tool_delta(self, raw: Any) -> list[ProviderEvent]:
        if not isinstance(raw, Mapping):
            raise Failed(malformed("tool call delta must be an object", type(raw).__name__))
        function = raw.get("function") or {}
        if not isinstance(function, Mapping):
            raise Failed(malformed("tool call function must be an object", "function"))
        call_id, name, fragment = raw.get("id"), function.get("name"), function.get("arguments")
        for field, value in (("id", call_id), ("function name", name), ("arguments", fragment)):
            if value is not None and type(value) is not str:
                raise Failed(malformed(f"tool call {field} must be a string", repr(value)))
        index = self._index(raw.get("index"), call_id, name)
        events: list[ProviderEvent] = []
        calls = self.calls
        call = calls.get(index)
        if call is None:
            # Calls stream one after the other: the ones before are named.
            earlier = sorted(i for i in calls.unstarted if i < index)
            for i in earlier:
                events += self._start(calls[i])
            calls.unstarted.difference_update(earlier)
            call = calls[index] = _Call(index)
            calls.unstarted.add(index)
        if call_id:
            if call.id and call.id != call_id:
                raise Failed(malformed("tool call id changed at one index", f"index {index}"))
            call.id = unicode(call_id)
        if name and name != call.name:  # some servers repeat the whole name each delta
            if call.started:  # the name is complete once its arguments stream
                raise Failed(malformed("tool call name continued after its arguments", name))
            call.name += unicode(name)
        if fragment:
            call.fragments.append(fragment)
            piece = call.streamed.add(fragment)
            if call.started:
                if piece:
                    events.append(ToolCallArgumentsDelta(call.id, piece, index))
            elif call.name:
                events += self._start(call)
                calls.unstarted.discard(index)
        return events

    def _index(self, index: Any, call_id: str | None, name: str | None) -> int:
        """The index of a tool call delta that gave ``index``."""
        if index is None:
            # No index (some servers): a delta naming a new call starts one,
            # any other (or one repeating the last call's id) continues it.
            calls = self.calls
            last = max(calls) if calls else None
            if last is not None and (
                not (call_id or name) or (call_id and call_id == calls[last].id)
            ):
                index = last
            else:
                index = len(calls)
        if type(index) is not int or index < 0:
            raise Failed(malformed("tool call index must be a non-negative int", repr(index)))
        return index

    def _start(self, call: _Call) -> list[ProviderEvent]:
        """``ToolCallStarted`` for ``call`` once its name is known, and the
        arguments that arrived so far as one delta."""
        if not call.name:
            raise Failed(malformed("tool call without a function name", f"index {call.index}"))
        if not call.id:
            call.id = f"call_{self.request.attempt_id}_{call.index}"
        call.started = True
        events: list[ProviderEvent] = [
            ToolCallStarted(call.id, self.aliases.name(call.name), call.index)
        ]
        streamed = call.streamed.so_far()
        if streamed:
            events.append(ToolCallArgumentsDelta(call.id, streamed, call.index))
        return events

    def finish(self) -> Iterator[ProviderEvent]:
        """The events that end the response: each call not started yet
        starts, every call completes, then ``ResponseCompleted`` (its
        message keeps the finish reason).  A response cut at the output
        limit (``length``) or withheld (``content_filter``) fails instead:
        a call it cut is never dispatched, a cut answer never passes for
        a whole one."""
        cut = _cut(self.finish_reason)
        if cut is not None:
            raise Failed(cut)
        blocks: list[dict[str, Any]] = []
        if self.thinking:
            blocks.append({"type": "thinking", "thinking": self.thinking.text()})
        if self.text:
            blocks.append({"type": "text", "text": self.text.text()})
        for index in sorted(self.calls):
            call = self.calls[index]
            if not call.started:
                yield from self._start(call)
            name = self.aliases.name(call.name)
            arguments = parse_arguments(call.arguments)
            yield ToolCallCompleted(call.id, name, arguments)
            blocks.append(
                {"type": "tool_call", "id": call.id, "name": name, "arguments": arguments}
            )
        content: Any = blocks
        if not self.calls and not self.thinking:
            content = self.text.text()
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.finish_reason is not None:
            message["finish_reason"] = self.finish_reason
        yield ResponseCompleted(message)


def _cut(reason: str | None) -> Error | None:
    """The failure a finish reason stands for, if it is one."""
    details = {"reason": f"finish_{reason}", "finish_reason": reason}
    if reason == "length":
        return Error(
            ErrorClass.BUDGET_EXCEEDED,
            "provider stopped at its output token limit (finish_reason length)",
            details,
        )
    if reason == "content_filter":
        return Error(
            ErrorClass.FORBIDDEN,
            "provider withheld its answer (finish_reason content_filter)",
            details,
        )
    return None
