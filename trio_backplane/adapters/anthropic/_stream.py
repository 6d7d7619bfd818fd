"""A Messages stream decoded: ``message_start``, each content block's
start, deltas and stop, ``message_delta`` (the stop reason and usage), then
``message_stop``; ``ping`` ignored, ``error`` the server's report, event
types the API may add ignored."""

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

__all__ = ["MessageDecoder"]


class _Block:
    """One content block: its start as the API gave it, its streamed text
    (text, thinking or a tool call's JSON) and, for a call, its ordinal."""

    __slots__ = ("kind", "ordinal", "signature", "start", "streamed")

    def __init__(self, start: Mapping[str, Any], ordinal: int) -> None:
        self.start = start
        self.kind = start.get("type")
        self.ordinal = ordinal  # among blocks of its kind: the events' index
        self.streamed = StreamedText()
        self.signature: list[str] = []


class MessageDecoder:
    """The :class:`~.._http._reader.Decoder` of a Messages stream."""

    def __init__(self, aliases: ToolAliases, request: ProviderRequest) -> None:
        self.aliases = aliases
        self.request = request
        self.blocks: dict[int, _Block] = {}
        self._kinds: dict[str, int] = {}  # blocks started, by kind
        self.usage: dict[str, Any] = {}
        #: the ``stop_reason`` of ``message_delta`` (``None``: none came)
        self.stop_reason: str | None = None
        self._finishes = False
        #: a continued turn: the usage of its earlier messages, summed, and
        #: where this message's block indexes start among the turn's
        self._spent: dict[str, Any] = {}
        self._offset = 0

    @property
    def paused(self) -> bool:
        """Whether the message ended ``pause_turn``: the API stopped a long
        turn (its server tools), to be continued by sending it back."""
        return self.stop_reason == "pause_turn"

    def paused_turn(self) -> dict[str, Any]:
        """The assistant turn so far, in the API's shape, to send back."""
        content = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.kind == "tool_use":
                content.append({**block.start, "input": _arguments(block)})
            else:
                content.append(_finished(block))
        return {"role": "assistant", "content": content}

    def resume(self) -> None:
        """Decode the next message as the same turn's continuation: its
        blocks after this one's, its usage added."""
        self._spent = self._totals()
        self.usage = {}
        self._offset = max(self.blocks, default=-1) + 1
        self.stop_reason = None
        self._finishes = False

    def _totals(self) -> dict[str, Any]:
        """This message's usage plus the earlier messages' (counts summed,
        nested ones too: ``server_tool_use.web_search_requests``)."""
        return _summed(self._spent, self.usage)

    def ends(self, kind: str, data: str) -> bool:
        return kind == "message_stop"

    def finishes(self) -> bool:
        return self._finishes

    def decode(self, kind: str, data: str) -> list[ProviderEvent]:
        self._finishes = False
        if not data:
            return []
        try:
            payload = loads(data)
        except (ValueError, RecursionError):
            if kind == "error":
                raise Reported(stream_error(data)) from None
            raise Failed(malformed("stream event is not JSON", data)) from None
        if not isinstance(payload, Mapping):
            raise Failed(malformed("stream event is not a JSON object", type(payload).__name__))
        handler = _HANDLERS.get(str(payload.get("type", kind)))
        return [] if handler is None else handler(self, payload)

    def whole(self, text: str) -> list[ProviderEvent]:
        """The events of a whole, non-streamed message: those its stream
        would give, then the completion; raises ``Failed`` as a stream
        would."""
        try:
            message = loads(text)  # text repaired where it is taken, as streamed
        except (ValueError, RecursionError):
            raise Failed(malformed("response is not JSON", text[:200])) from None
        if not isinstance(message, Mapping):
            raise Failed(malformed("response is not a JSON object", type(message).__name__))
        if message.get("type") == "error":
            self._error(message)
        content = message.get("content")
        if not isinstance(content, list):
            raise Failed(malformed("message content must be a list", type(content).__name__))
        events = self._message_start({"message": message})
        for index, block in enumerate(content):
            events += self._block_start({"index": index, "content_block": block})
        delta = {"stop_reason": message.get("stop_reason")}
        events += self._message_delta({"delta": delta, "usage": message.get("usage")})
        return [*events, *self.finish()]

    def _error(self, payload: Mapping[str, Any]) -> list[ProviderEvent]:
        error = payload.get("error")
        if isinstance(error, Mapping):
            raise Reported(stream_error(error.get("message"), error.get("type")))
        raise Reported(stream_error(error))

    def _message_start(self, payload: Mapping[str, Any]) -> list[ProviderEvent]:
        message = payload.get("message")
        usage = message.get("usage") if isinstance(message, Mapping) else None
        self._usage(usage)  # reported once, merged, with message_delta's
        return []

    def _message_delta(self, payload: Mapping[str, Any]) -> list[ProviderEvent]:
        delta = payload.get("delta")
        if isinstance(delta, Mapping):
            reason = delta.get("stop_reason")
            if isinstance(reason, str) and reason:
                self.stop_reason = unicode(reason)[:100]
                self._finishes = True
        if not self._usage(payload.get("usage")):
            return []
        return [Usage(self._totals())]  # one report a message: the turn's totals

    def _usage(self, usage: Any) -> bool:
        """Merge a usage report (``message_delta``'s counts are totals over
        ``message_start``'s); whether there was one."""
        if not isinstance(usage, Mapping):
            return False
        self.usage.update(replace_surrogates(dict(usage)))
        return True

    def _block_start(self, payload: Mapping[str, Any]) -> list[ProviderEvent]:
        index, start = payload.get("index"), payload.get("content_block")
        if type(index) is not int or index < 0 or index + self._offset in self.blocks:
            raise Failed(malformed("content block index must be a new int", repr(index)))
        index += self._offset
        if not isinstance(start, Mapping):
            raise Failed(malformed("content_block must be an object", type(start).__name__))
        kind = start.get("type")
        if type(kind) is not str or not kind:
            raise Failed(malformed("content_block needs a str type", repr(start)[:200]))
        ordinal = self._kinds.get(kind, 0)
        self._kinds[kind] = ordinal + 1
        block = self.blocks[index] = _Block(replace_surrogates(dict(start)), ordinal)
        if kind == "tool_use":
            call_id, name = block.start.get("id"), block.start.get("name")
            if type(call_id) is not str or not call_id or type(name) is not str or not name:
                raise Failed(malformed("tool_use block needs a str id and name", repr(start)))
            return [ToolCallStarted(call_id, self.aliases.name(name), ordinal)]
        initial = block.start.get(kind) if kind in ("text", "thinking") else None
        return self._piece(block, initial) if isinstance(initial, str) else []

    def _block_delta(self, payload: Mapping[str, Any]) -> list[ProviderEvent]:
        index, delta = payload.get("index"), payload.get("delta")
        block = self.blocks.get(index + self._offset) if type(index) is int else None
        if block is None:
            raise Failed(malformed("delta for a content block never started", repr(payload)))
        if not isinstance(delta, Mapping):
            raise Failed(malformed("content block delta must be an object", repr(delta)))
        kind = delta.get("type")
        field = _DELTA_FIELDS.get(str(kind))
        if field is None:
            return []  # citations and what the API adds later: not ours to read
        value = delta.get(field)
        if type(value) is not str:
            raise Failed(malformed(f"{kind} needs a str {field}", repr(value)))
        if kind == "signature_delta":
            block.signature.append(value)
            return []
        return self._piece(block, value)

    def _piece(self, block: _Block, text: str) -> list[ProviderEvent]:
        piece = block.streamed.add(text) if text else ""
        if not piece:
            return []
        if block.kind == "tool_use":
            return [ToolCallArgumentsDelta(block.start["id"], piece, block.ordinal)]
        if block.kind == "thinking":
            return [ThinkingDelta(piece, block.ordinal)]
        if block.kind == "text":
            return [TextDelta(piece, block.ordinal)]
        return []

    def finish(self) -> Iterator[ProviderEvent]:
        """Each tool call completes, then ``ResponseCompleted``: its content
        the blocks in order (thinking with its signature, as the API needs
        it back), its ``finish_reason`` the stop reason.  A message cut at
        ``max_tokens`` (or the context window) or refused fails instead;
        a paused one gives nothing yet (the turn goes on)."""
        if self.paused:
            return
        cut = _cut(self.stop_reason)
        if cut is not None:
            raise Failed(cut)
        content: list[dict[str, Any]] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            if block.kind == "tool_use":
                call_id, name = block.start["id"], self.aliases.name(block.start["name"])
                arguments = _arguments(block)
                yield ToolCallCompleted(call_id, name, arguments)
                content.append(
                    {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}
                )
            else:
                content.append(_finished(block))
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if all(block["type"] == "text" for block in content):
            message["content"] = "".join(block["text"] for block in content)
        if self.stop_reason is not None:
            message["finish_reason"] = self.stop_reason
        yield ResponseCompleted(message)


def _arguments(block: _Block) -> Any:
    """A ``tool_use`` block's input: streamed, else as it started."""
    text = block.streamed.text()
    return parse_arguments(text) if text else block.start.get("input", {})


def _summed(before: Mapping[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    """``usage`` added to ``before``: ints summed, mappings key by key, any
    other value (a service tier) the later one."""
    totals = dict(before)
    for key, value in usage.items():
        was = totals.get(key)
        if type(value) is int and type(was) is int:
            totals[key] = was + value
        elif isinstance(value, Mapping) and isinstance(was, Mapping):
            totals[key] = _summed(was, value)
        else:
            totals[key] = value
    return totals


def _finished(block: _Block) -> dict[str, Any]:
    """A block other than a tool call as it ends: streamed text in its field,
    the signature joined; any other kind as it started."""
    finished = dict(block.start)
    if block.kind in ("text", "thinking"):
        finished[block.kind] = block.streamed.text()
    elif block.streamed:  # a server tool's input, streamed as a call's is
        finished["input"] = parse_arguments(block.streamed.text())
    if block.signature:
        finished["signature"] = "".join(block.signature)
    return finished


#: the field of each delta type carrying its text
_DELTA_FIELDS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
    "signature_delta": "signature",
}

_HANDLERS = {
    "error": MessageDecoder._error,
    "message_start": MessageDecoder._message_start,
    "message_delta": MessageDecoder._message_delta,
    "content_block_start": MessageDecoder._block_start,
    "content_block_delta": MessageDecoder._block_delta,
}


def _cut(reason: str | None) -> Error | None:
    """The failure a stop reason stands for, if it is one."""
    details = {"reason": f"finish_{reason}", "finish_reason": reason}
    if reason in ("max_tokens", "model_context_window_exceeded"):
        return Error(
            ErrorClass.BUDGET_EXCEEDED,
            f"provider stopped at its token limit (stop_reason {reason})",
            details,
        )
    if reason == "refusal":
        return Error(
            ErrorClass.FORBIDDEN, "provider refused to answer (stop_reason refusal)", details
        )
    return None
