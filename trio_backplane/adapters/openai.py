"""An OpenAI-compatible chat-completions provider, streaming, on ``httpx``.

``OpenAIProvider(base_url, model)`` implements the provider protocol:
``stream(request, context)`` posts ``/chat/completions`` with ``stream: true``
and turns the server-sent chunks into provider events (text and reasoning
deltas, tool calls started / argument deltas / completed, usage verbatim when
the server sends it, and one terminal :class:`ResponseCompleted` or
:class:`ResponseFailed`).  ``httpx.AsyncClient`` runs on Trio through anyio.

* **Transcript.** User messages keep their content; an assistant message's
  ``tool_call`` blocks become ``tool_calls``; a tool message becomes a
  ``tool`` message whose content is the result's text (its
  ``structured_content`` as JSON when it has no text).
* **Tool names** that OpenAI cannot carry (``^[a-zA-Z0-9_-]{1,64}$``, e.g.
  ``github::get_me``) are sent as a reversible, per-request alias
  (:class:`ToolAliases`) and mapped back on the way in: events, transcripts
  and results keep the real name.
* **Tool calls** are assembled by index from their deltas (a delta without
  an index continues the last call unless it names a new one).  A name may
  come in pieces: a call is started (``ToolCallStarted``, then the
  arguments so far as one delta) once its arguments begin, the next call
  begins or the response ends.  A new id at one index, a call without a
  name, a name continued after its arguments, or an id, name or arguments
  that are not strings make a malformed stream.  Only choice 0 is read, and
  only its finish reason finishes the response.
* **Text** that is not valid Unicode never reaches the transcript: invalid
  UTF-8 bytes and lone UTF-16 surrogate escapes (``"\\ud800"``, valid JSON)
  both decode to U+FFFD.
* **The end.** ``[DONE]`` ends the response at once (the body is not read
  further); after a finish reason, the rest (the usage, ``[DONE]``) has
  ``tail_timeout`` seconds to arrive, and a connection lost, a read timeout
  or a server that goes silent before ``[DONE]`` still completes the
  response with what arrived (usage that never came is not invented).
* **Errors** are classed: HTTP 429 and 5xx, a dropped connection, a timeout and
  a stream that ends before a finish reason or ``[DONE]`` are
  ``transient_transport`` (a retry is the host's call); 401/403 are
  ``forbidden``; any other 4xx is ``validation``; a chunk that is not a JSON
  object (or nests too deep to parse, or holds a number no double holds), an
  event larger than 8 MiB, or a response that is not an event stream, is
  ``execution_failure`` with ``details["reason"]`` ``"malformed_stream"``.
  An error reported mid-stream is the response's failure: the stream is
  then read on (to ``[DONE]``, for ``tail_timeout`` at most) only to close
  it cleanly.  An error response's body is read up to 64 KiB.
* **The API key** is read from ``context["api_key"]`` (the trusted
  ``provider_context``) and sent only as the ``Authorization`` header: it is
  never logged, never part of an event, a request record or an error.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from contextlib import aclosing
from typing import Any, Final, final

import trio

from .._numbers import is_seconds
from . import _missing_extra

try:
    import httpx
except ModuleNotFoundError as _missing:  # pragma: no cover - depends on the install
    raise _missing_extra("openai", _missing) from _missing

from ..errors import Error, ErrorClass
from ..kernel import check_json, loads
from ..runtime import (
    ProviderEvent,
    ProviderRequest,
    ResponseCompleted,
    ResponseFailed,
    TextDelta,
    ThinkingDelta,
    ToolCallArgumentsDelta,
    ToolCallCompleted,
    ToolCallStarted,
    Usage,
)

__all__ = ["OPENAI_NAME", "OpenAIProvider", "ToolAliases", "transcript_messages"]

#: The function names an OpenAI-compatible API accepts.
OPENAI_NAME: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_UNSAFE_CHARS: Final = re.compile(r"[^a-zA-Z0-9_-]")
_MAX_TEXT: Final = 500
#: The shortest prefix of the key redacted where a text ends (a cut through an echo).
_MIN_KEY_FRAGMENT: Final = 6
_REDACTED: Final = "[redacted]"
#: A ``\\uD800``..``\\uDFFF`` escape in JSON text: the only way to a lone surrogate.
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")
#: Events read (and ignored) after a malformed chunk before giving up.
_DRAIN_LIMIT: Final = 1000
#: The most one server-sent event may hold (characters of its data lines and
#: of the line being read, each part counted with what a str costs beside
#: its text): a line that never ends cannot grow without bound.
_MAX_EVENT: Final = 8 * 1024 * 1024
_PART_COST: Final = 64
#: The most of an error response's body read (the rest is not waited for).
_MAX_ERROR_BODY: Final = 64 * 1024
#: Where a line of an event stream ends: CRLF, LF or CR.
_LINE_END: Final = re.compile(r"\r\n|\r|\n")


@final
class ToolAliases:
    """A reversible map between real tool names and provider-safe aliases.

    A name OpenAI accepts is its own alias; any other becomes its safe
    characters (truncated) plus a hash of the real name, never colliding with
    another real name or alias of the same set.
    """

    __slots__ = ("_to_alias", "_to_name")

    def __init__(self, names: Iterable[str]) -> None:
        self._to_alias: dict[str, str] = {}
        self._to_name: dict[str, str] = {}
        if isinstance(names, str | bytes | Mapping) or not isinstance(names, Iterable):
            raise Error(
                ErrorClass.VALIDATION,
                "tool names must be an iterable of str",
                {"type": type(names).__name__},
            )
        names = list(dict.fromkeys(names))
        if not all(type(name) is str for name in names):
            raise Error(ErrorClass.VALIDATION, "tool names must be an iterable of str")
        for name in names:
            if OPENAI_NAME.fullmatch(name):
                self._bind(name, name)
        for name in names:
            if name in self._to_alias:
                continue
            digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
            stem = _UNSAFE_CHARS.sub("_", name)
            for size in (8, 16, 32, 64):
                alias = f"{stem[: 63 - size]}_{digest[:size]}"
                if alias not in self._to_name:
                    self._bind(name, alias)
                    break
            else:  # pragma: no cover - a SHA-256 collision
                raise Error(ErrorClass.VALIDATION, "cannot alias tool name", {"tool": name})

    def _bind(self, name: str, alias: str) -> None:
        self._to_alias[name] = alias
        self._to_name[alias] = name

    def alias(self, name: str) -> str:
        """The alias of ``name`` (a name outside the set is sanitized the same way)."""
        known = self._to_alias.get(name)
        if known is not None:
            return known
        return ToolAliases([name]).alias(name)

    def name(self, alias: str) -> str:
        """The real name of ``alias``; an unknown alias comes back unchanged."""
        return self._to_name.get(alias, alias)


# -- the request ------------------------------------------------------------------


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        parts = [
            str(block.get("text", ""))
            for block in content
            if isinstance(block, Mapping) and block.get("type") == "text"
        ]
        return "".join(parts)
    return ""


def _user_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        return [
            {"type": "text", "text": str(block.get("text", ""))}
            for block in content
            if isinstance(block, Mapping) and block.get("type") == "text"
        ]
    return str(content)


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def _tool_content(result: Any) -> str:
    if not isinstance(result, Mapping):
        return json.dumps(result, ensure_ascii=False)
    text = _text_of(result.get("content"))
    if not text and result.get("structured_content") is not None:
        text = json.dumps(result["structured_content"], ensure_ascii=False)
    return text


def transcript_messages(messages: Iterable[Any], aliases: ToolAliases) -> list[dict[str, Any]]:
    """Our transcript as chat-completions messages (tool names aliased)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role == "user":
            out.append({"role": "user", "content": _user_content(message.get("content"))})
        elif role == "system":
            out.append({"role": "system", "content": _text_of(message.get("content"))})
        elif role == "assistant":
            content = message.get("content")
            calls = []
            if isinstance(content, list | tuple):
                for block in content:
                    if isinstance(block, Mapping) and block.get("type") == "tool_call":
                        calls.append(
                            {
                                "id": str(block.get("id")),
                                "type": "function",
                                "function": {
                                    "name": aliases.alias(str(block.get("name"))),
                                    "arguments": _arguments_text(block.get("arguments")),
                                },
                            }
                        )
            entry: dict[str, Any] = {"role": "assistant", "content": _text_of(content) or None}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
        elif role == "tool":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": str(message.get("tool_call_id")),
                    "content": _tool_content(message.get("result")),
                }
            )
    return out


# -- the provider ---------------------------------------------------------------


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
        self.streamed = _StreamedText()
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


class _Failed(Exception):
    def __init__(self, error: Error) -> None:
        super().__init__(error.message)
        self.error = error


@final
class OpenAIProvider:
    """A streaming chat-completions provider for any OpenAI-compatible endpoint.

    ``base_url`` is the API root (``https://api.openai.com/v1``);
    ``client`` an ``httpx.AsyncClient`` to share (otherwise one is opened and
    closed per attempt); ``timeout`` bounds connecting and each read, in
    seconds; ``tail_timeout`` how long, after a finish reason, the rest of
    the response may take (a server that keeps the connection open without
    ``[DONE]`` then costs this, not a read timeout); ``system`` an optional
    system prompt; ``extra_body`` fields merged into every request body
    (``temperature``, ...).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout: float = 60.0,
        tail_timeout: float = 2.0,
        system: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise Error(ErrorClass.VALIDATION, "base_url must be an http(s) URL")
        if not isinstance(model, str) or not model:
            raise Error(ErrorClass.VALIDATION, "model must be a non-empty str")
        for name, seconds in (("timeout", timeout), ("tail_timeout", tail_timeout)):
            if not is_seconds(seconds):
                raise Error(ErrorClass.VALIDATION, f"{name} must be a positive number")
        if system is not None and type(system) is not str:
            raise Error(ErrorClass.VALIDATION, "system must be a str or None")
        if extra_body is not None:
            if not isinstance(extra_body, Mapping):
                raise Error(ErrorClass.VALIDATION, "extra_body must be a mapping or None")
            check_json(dict(extra_body), "extra_body")
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise Error(ErrorClass.VALIDATION, "client must be an httpx.AsyncClient or None")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout = float(timeout)
        self.tail_timeout = float(tail_timeout)
        self.system = system
        self.extra_body = dict(extra_body or {})
        self._client = client

    def __repr__(self) -> str:
        return f"OpenAIProvider({self.url!r}, {self.model!r})"

    def body(self, request: ProviderRequest, aliases: ToolAliases) -> dict[str, Any]:
        """The chat-completions request body for ``request`` (no credentials inside)."""
        messages = transcript_messages(request.messages, aliases)
        if self.system:
            messages.insert(0, {"role": "system", "content": self.system})
        body: dict[str, Any] = {
            **self.extra_body,
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": aliases.alias(tool.name),
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
        return body

    def stream(
        self, request: ProviderRequest, context: Mapping[str, Any] | None
    ) -> AsyncIterator[ProviderEvent]:
        if not isinstance(request, ProviderRequest):
            raise Error(ErrorClass.VALIDATION, "stream needs a ProviderRequest")
        if context is not None and not isinstance(context, Mapping):
            raise Error(ErrorClass.VALIDATION, "provider_context must be a mapping or None")
        api_key = None if context is None else context.get("api_key")
        if api_key is not None and (
            not isinstance(api_key, str) or not _HEADER_TEXT.fullmatch(api_key)
        ):
            # Never quoted: the key itself stays out of every error text.
            raise Error(
                ErrorClass.VALIDATION,
                "provider_context api_key must be a non-empty str of printable ASCII"
                " (an HTTP header value)",
            )
        return self._events(request, api_key)

    async def _events(
        self, request: ProviderRequest, api_key: str | None
    ) -> AsyncIterator[ProviderEvent]:
        aliases = ToolAliases(tool.name for tool in request.tools)
        body = self.body(request, aliases)
        headers = {"Content-Type": "application/json"}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        client = self._client
        own = client is None
        if client is None:
            client = httpx.AsyncClient(timeout=self.timeout)
        try:
            try:
                async with aclosing(
                    self._exchange(client, body, headers, aliases, request)
                ) as events:
                    async for event in events:
                        yield event
            except _Failed as failed:
                yield ResponseFailed(_redact(failed.error, api_key))
        finally:
            if own:
                await client.aclose()

    async def _exchange(
        self,
        client: httpx.AsyncClient,
        body: dict[str, Any],
        headers: dict[str, str],
        aliases: ToolAliases,
        request: ProviderRequest,
    ) -> AsyncGenerator[ProviderEvent, None]:
        calls = _Calls()
        text = _StreamedText()
        thinking = _StreamedText()
        finished = done = False
        failure: Error | None = None
        lost: Error | None = None
        drained = 0
        stream_headers = {**headers, "Accept": "text/event-stream", "Cache-Control": "no-store"}
        try:
            async with client.stream(
                "POST", self.url, json=body, headers=stream_headers, timeout=self.timeout
            ) as response:
                if response.status_code != 200:
                    said = await _head(response, self.tail_timeout)
                    raise _Failed(_http_error(response.status_code, said))
                media_type = response.headers.get("content-type", "").partition(";")[0]
                if media_type.strip().lower() != "text/event-stream":
                    raise _Failed(_malformed("response is not an event stream", media_type[:100]))
                # Event streams are UTF-8; one leading byte order mark is not
                # part of the first field's name (the SSE specification).
                response.encoding = "utf-8-sig"
                # Read the body on after a failure (up to _DRAIN_LIMIT events
                # and tail_timeout), so the stream closes cleanly; [DONE] ends
                # it at once: what a server does after it cannot change the
                # response, nor its failure.
                async with aclosing(_server_sent_events(response)) as sses:
                    tail_by = math.inf  # after a finish reason: when reading stops
                    while True:
                        with trio.CancelScope(deadline=tail_by) as tail:
                            try:
                                kind, data = await anext(sses)
                            except StopAsyncIteration:
                                break
                            except _Failed as failed:  # an event past the bound
                                failure = failure or failed.error  # a reported one wins
                                break
                        if tail.cancelled_caught:  # silent since the finish or failure
                            break
                        data = data.strip()
                        if data == "[DONE]":
                            done = True
                            break
                        if failure is not None:
                            drained += 1
                            if drained > _DRAIN_LIMIT:
                                break
                            continue
                        if kind == "error":  # an SSE error event, whatever its data
                            failure = _stream_error(data)
                        elif data:
                            try:
                                chunk = _chunk(data)
                                events = self._chunk_events(
                                    chunk, calls, text, thinking, aliases, request
                                )
                            except _Failed as failed:
                                failure = failed.error
                        if failure is not None:
                            tail_by = min(tail_by, trio.current_time() + self.tail_timeout)
                            continue
                        if not data:
                            continue
                        for event in events:
                            yield event
                        if any(  # the choice read: index 0 (_chunk_events)
                            isinstance(c, Mapping)
                            and c.get("index", 0) == 0
                            and c.get("finish_reason")
                            for c in chunk.get("choices") or ()
                        ):
                            if not finished:
                                tail_by = trio.current_time() + self.tail_timeout
                            finished = True
                    if done:
                        await _abandon(sses)
        except httpx.TimeoutException as exc:
            lost = _transport("provider request timed out", exc, "timeout")
        except httpx.HTTPError as exc:
            lost = _transport("provider connection failed", exc, "connection")
        if failure is not None:  # what the server said, not how the stream then ended
            raise _Failed(failure)
        if lost is not None and not finished:
            raise _Failed(lost)  # after a finish reason, what arrived is the response
        if not (done or finished):
            raise _Failed(
                Error(
                    ErrorClass.TRANSIENT_TRANSPORT,
                    "provider stream ended before the response finished",
                    {"reason": "stream_truncated"},
                )
            )
        blocks: list[dict[str, Any]] = []
        if thinking:
            blocks.append({"type": "thinking", "thinking": thinking.text()})
        if text:
            blocks.append({"type": "text", "text": text.text()})
        for index in sorted(calls):
            call = calls[index]
            if not call.started:
                for event in self._start(call, aliases, request):
                    yield event
            name = aliases.name(call.name)
            arguments = _parse_arguments(call.arguments)
            yield ToolCallCompleted(call.id, name, arguments)
            blocks.append(
                {"type": "tool_call", "id": call.id, "name": name, "arguments": arguments}
            )
        content: Any = blocks
        if not calls and not thinking:
            content = text.text()
        yield ResponseCompleted({"role": "assistant", "content": content})

    def _chunk_events(  # noqa: PLR0917
        self,
        chunk: Mapping[str, Any],
        calls: _Calls,
        text: _StreamedText,
        thinking: _StreamedText,
        aliases: ToolAliases,
        request: ProviderRequest,
    ) -> list[ProviderEvent]:
        events: list[ProviderEvent] = []
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            events.append(Usage(_replace_surrogates(dict(usage))))
        choices = chunk.get("choices")
        if choices is None:
            choices = []
        if not isinstance(choices, list):
            raise _Failed(_malformed("chunk choices must be a list", type(choices).__name__))
        for choice in choices:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if not isinstance(delta, Mapping):
                raise _Failed(_malformed("chunk delta must be an object", type(delta).__name__))
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                piece = thinking.add(reasoning)
                if piece:
                    events.append(ThinkingDelta(piece))
            content = delta.get("content")
            if isinstance(content, str) and content:
                piece = text.add(content)
                if piece:
                    events.append(TextDelta(piece))
            tool_calls = delta.get("tool_calls") or ()
            if not isinstance(tool_calls, list | tuple):
                raise _Failed(
                    _malformed("chunk tool_calls must be an array", type(tool_calls).__name__)
                )
            for raw in tool_calls:
                events.extend(self._tool_delta(raw, calls, aliases, request))
        return events

    def _tool_delta(
        self,
        raw: Any,
        calls: _Calls,
        aliases: ToolAliases,
        request: ProviderRequest,
    ) -> list[ProviderEvent]:
        if not isinstance(raw, Mapping):
            raise _Failed(_malformed("tool call delta must be an object", type(raw).__name__))
        function = raw.get("function") or {}
        if not isinstance(function, Mapping):
            raise _Failed(_malformed("tool call function must be an object", "function"))
        call_id, name, fragment = raw.get("id"), function.get("name"), function.get("arguments")
        for field, value in (("id", call_id), ("function name", name), ("arguments", fragment)):
            if value is not None and type(value) is not str:
                raise _Failed(_malformed(f"tool call {field} must be a string", repr(value)))
        index = raw.get("index")
        if index is None:
            # No index (some servers): a delta naming a new call starts one,
            # any other (or one repeating the last call's id) continues it.
            last = max(calls) if calls else None
            if last is not None and (
                not (call_id or name) or (call_id and call_id == calls[last].id)
            ):
                index = last
            else:
                index = len(calls)
        if type(index) is not int or index < 0:
            raise _Failed(_malformed("tool call index must be a non-negative int", repr(index)))
        events: list[ProviderEvent] = []
        call = calls.get(index)
        if call is None:
            # Calls stream one after the other: the ones before are named.
            earlier = sorted(i for i in calls.unstarted if i < index)
            for i in earlier:
                events += self._start(calls[i], aliases, request)
            calls.unstarted.difference_update(earlier)
            call = calls[index] = _Call(index)
            calls.unstarted.add(index)
        if call_id:
            if call.id and call.id != call_id:
                raise _Failed(_malformed("tool call id changed at one index", f"index {index}"))
            call.id = _unicode(call_id)
        if name and name != call.name:  # some servers repeat the whole name each delta
            if call.started:  # the name is complete once its arguments stream
                raise _Failed(_malformed("tool call name continued after its arguments", name))
            call.name += _unicode(name)
        if fragment:
            call.fragments.append(fragment)
            piece = call.streamed.add(fragment)
            if call.started:
                if piece:
                    events.append(ToolCallArgumentsDelta(call.id, piece, index))
            elif call.name:
                events += self._start(call, aliases, request)
                calls.unstarted.discard(index)
        return events

    @staticmethod
    def _start(call: _Call, aliases: ToolAliases, request: ProviderRequest) -> list[ProviderEvent]:
        """``ToolCallStarted`` for ``call`` once its name is known (its
        arguments began, the next call began, or the response ended), and the
        arguments that arrived so far as one delta."""
        if not call.name:
            raise _Failed(_malformed("tool call without a function name", f"index {call.index}"))
        if not call.id:
            call.id = f"call_{request.attempt_id}_{call.index}"
        call.started = True
        events: list[ProviderEvent] = [
            ToolCallStarted(call.id, aliases.name(call.name), call.index)
        ]
        streamed = call.streamed.so_far()
        if streamed:
            events.append(ToolCallArgumentsDelta(call.id, streamed, call.index))
        return events


async def _abandon(sses: AsyncIterator[Any]) -> None:
    """Stop reading ``sses`` without waiting on the network.

    Events already buffered are discarded and the first read that would wait
    is cancelled: the cancellation unwinds httpx's own generators beneath
    (breaking out would leave them unexhausted), and closes the connection.
    """
    with trio.CancelScope() as scope:
        scope.cancel()
        async for _ in sses:
            pass


async def _server_sent_events(response: httpx.Response) -> AsyncGenerator[tuple[str, str], None]:
    """``(event type, data)`` of each event of ``response``'s event stream, as
    the SSE specification reads one: lines end at CRLF, LF or CR; a blank
    line dispatches the event; ``:`` starts a comment; ``data`` lines join
    with newlines; an event the stream ends in the middle of is dropped.
    An event (or a line) past :data:`_MAX_EVENT` characters is a malformed
    stream, refused as it grows: never held whole."""
    event, size = "", 0
    data: list[str] = []
    line: list[str] = []
    pending = 0  # characters of the line being read
    after_cr = False  # the last piece ended in CR: a leading LF belongs to it
    pieces = response.aiter_text()
    async with aclosing(pieces):  # type: ignore[type-var]  # an async generator
        async for received in pieces:
            piece = received[1:] if after_cr and received.startswith("\n") else received
            after_cr = piece.endswith("\r")
            start = 0
            for end in _LINE_END.finditer(piece):
                line.append(piece[start : end.start()])
                start = end.end()
                text = "".join(line)
                line, pending = [], 0
                if not text:
                    if data:
                        yield event or "message", "\n".join(data)
                    event, data, size = "", [], 0
                    continue
                field, colon, value = text.partition(":")
                if not field:
                    continue  # a comment
                if colon and value.startswith(" "):
                    value = value[1:]
                if field == "data":
                    data.append(value)
                    size += len(value) + _PART_COST
                elif field == "event":
                    event = value
            if start < len(piece):
                line.append(piece[start:])
                pending += len(piece) - start + _PART_COST
            if size + pending > _MAX_EVENT:
                await _abandon(pieces)  # unwinds httpx's generators beneath, closes
                raise _Failed(
                    _malformed("stream event is too large", f"more than {_MAX_EVENT} characters")
                )


class _StreamedText:
    """Text streamed in pieces.  A server slicing text by UTF-16 units may
    split a surrogate pair across two chunks: each piece then decodes to a
    lone surrogate.  A trailing high surrogate waits for the next piece, a
    pair is joined into its character, and a surrogate left alone becomes
    U+FFFD, so every piece (a delta) and the whole text are Unicode text."""

    __slots__ = ("_high", "_parts")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._high = ""

    def __bool__(self) -> bool:
        return bool(self._parts or self._high)

    def add(self, piece: str) -> str:
        """Take ``piece``; returns the text it completes (maybe empty)."""
        piece = self._high + piece
        self._high = ""
        if "\ud800" <= piece[-1] <= "\udbff":
            self._high, piece = piece[-1], piece[:-1]
        piece = _unicode(piece)
        if piece:
            self._parts.append(piece)
        return piece

    def so_far(self) -> str:
        """The text completed so far (a trailing high surrogate still waits)."""
        return "".join(self._parts)

    def text(self) -> str:
        if self._high:
            self._parts.append("\ufffd")
            self._high = ""
        return "".join(self._parts)


def _unicode(text: str) -> str:
    """``text`` with each surrogate pair joined into its character and each
    lone surrogate replaced by U+FFFD (ASCII: a flag read)."""
    if text.isascii() or not _LONE_SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _chunk(data: str) -> Mapping[str, Any]:
    try:
        # Lone surrogates are kept here: text pieces join them (_StreamedText).
        chunk = loads(data)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
        raise _Failed(_malformed("stream chunk is not JSON", data)) from None
    if not isinstance(chunk, Mapping):
        raise _Failed(_malformed("stream chunk is not a JSON object", type(chunk).__name__))
    error = chunk.get("error")
    if error is not None:  # an object, or a bare message some servers send
        message = error.get("message") if isinstance(error, Mapping) else error
        raise _Failed(_stream_error(message))
    return chunk


def _stream_error(message: Any) -> Error:
    return Error(
        ErrorClass.TRANSIENT_TRANSPORT,
        "provider reported an error mid-stream",
        {"reason": "stream_error", "provider_message": _unicode(str(message))[:500]},
    )


def _loads(text: str) -> Any:
    """Strict JSON (``kernel.loads``) holding no lone UTF-16 surrogate: an
    escape that is not half of a pair decodes to U+FFFD, as invalid UTF-8
    bytes already do, so what a server sends can always be stored."""
    value = loads(text)
    if _SURROGATE_ESCAPE.search(text):  # rare: only then walk the value
        value = _replace_surrogates(value)
    return value


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _unicode(value)
    if isinstance(value, list):
        return [_replace_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    return value


def _parse_arguments(text: str) -> Any:
    text = _unicode(text)  # fragments may split a surrogate pair
    if not text.strip():
        return {}
    try:
        return _loads(text)  # strict: NaN and Infinity stay text
    except (ValueError, RecursionError):
        return text  # the gateway refuses it as a validation tool result


#: What a bearer token may hold: printable ASCII, no spaces at its ends (a
#: pasted curly quote or a newline would fail inside httpx, unclassed).
_HEADER_TEXT: Final = re.compile(r"[!-~](?:[ -~]*[!-~])?")


def _malformed(message: str, detail: str) -> Error:
    return Error(
        ErrorClass.EXECUTION_FAILURE,
        message,
        {"reason": "malformed_stream", "detail": detail},
    )


def _transport(message: str, exc: BaseException, reason: str) -> Error:
    return Error(
        ErrorClass.TRANSIENT_TRANSPORT,
        message,
        {"reason": reason, "cause": type(exc).__name__},
    )


async def _head(response: httpx.Response, patience: float) -> str:
    """The first :data:`_MAX_ERROR_BODY` bytes of ``response``'s body as
    text, read for ``patience`` seconds at most: an endless body is not
    held, one that stalls or breaks off is not waited for (the status
    classes the response whatever its body does)."""
    parts: list[bytes] = []
    size = 0
    pieces = response.aiter_bytes()
    with trio.move_on_after(patience):
        try:
            async for piece in pieces:
                parts.append(piece)
                size += len(piece)
                if size >= _MAX_ERROR_BODY:
                    await _abandon(pieces)
                    break
        except httpx.HTTPError:
            pass  # what arrived is the body
    return b"".join(parts)[:_MAX_ERROR_BODY].decode("utf-8", "replace")


def _http_error(status: int, text: str) -> Error:
    """The error an HTTP status and its body's text make; the server's own
    message from the JSON shapes servers use (``{"error": {"message"}}``,
    ``{"error": "..."}``, ``{"message"}``, ``{"detail"}``), else the text."""
    provider_message = text
    try:
        payload = _loads(text)
    except (ValueError, RecursionError):
        payload = None
    if isinstance(payload, Mapping):
        error = payload.get("error")
        if isinstance(error, Mapping):
            error = error.get("message")
        for candidate in (error, payload.get("message"), payload.get("detail")):
            if isinstance(candidate, str) and candidate:
                provider_message = candidate
                break
    details = {"status": status, "provider_message": provider_message}
    if status == 429 or status >= 500:
        return Error(ErrorClass.TRANSIENT_TRANSPORT, f"provider answered HTTP {status}", details)
    if status in (401, 403):
        return Error(ErrorClass.FORBIDDEN, f"provider refused the request (HTTP {status})", details)
    return Error(ErrorClass.VALIDATION, f"provider rejected the request (HTTP {status})", details)


def _excerpt(text: str, api_key: str | None, limit: int | None = None) -> str:
    """``text`` with the key redacted, then cut to ``limit``.

    Redacting first means a key across the cut never survives as a prefix;
    a prefix of the key still ending the text (a server that cut its own
    echo) is redacted too.
    """
    if api_key:
        text = text.replace(api_key, _REDACTED)
    if limit is not None:
        text = text[:limit]
    if api_key:
        for size in range(min(len(api_key), len(text)), _MIN_KEY_FRAGMENT - 1, -1):
            if text.endswith(api_key[:size]):
                return text[:-size] + _REDACTED
    return text


def _redact(error: Error, api_key: str | None) -> Error:
    """The error as it may leave: the key never back in through text a server
    echoed, and server text (left whole until now) cut to ``_MAX_TEXT``."""
    details = {
        key: _excerpt(value, api_key, _MAX_TEXT) if isinstance(value, str) else value
        for key, value in error.details.items()
    }
    return Error(error.error_class, _excerpt(error.message, api_key), details)
