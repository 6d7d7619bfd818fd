"""A tiny loopback HTTP server speaking streaming chat-completions (SSE).

``ChatServer`` runs a stdlib ``ThreadingHTTPServer`` on 127.0.0.1, port 0,
in a daemon thread.  Each POST to ``/v1/chat/completions`` consumes the next
scripted reply: :class:`Stream` (SSE chunks, optionally without ``[DONE]``,
optionally dropping the connection mid-body, optionally ending with a
dropped, reset or silent connection instead of the body's end) or
:class:`Status` (a plain HTTP error).  Every request's JSON body and headers are recorded.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import attrs


@attrs.frozen
class Stream:
    """SSE ``chunks`` (objects are JSON-encoded, strings sent as they are; a
    ``(event type, data)`` pair is sent with its ``event:`` line)."""

    chunks: tuple[Any, ...]
    done: bool = True
    drop: bool = False  # close the socket without ending the chunked body
    #: after the chunks (and [DONE]): end the body, close the socket, reset
    #: it, or keep it open and silent until the server stops
    tail: Literal["end", "drop", "reset", "hang"] = "end"
    #: raw bytes sent before the chunks (a byte order mark, an ``event:`` line)
    prefix: bytes = b""


@attrs.frozen
class Status:
    status: int
    body: Any = None
    raw: bool = False  # send ``body`` as plain text, not a JSON error object
    #: announce a body twice as long as ``body``, send ``body``, then go silent
    stall: bool = False
    #: the error object's ``code``, and more response headers
    code: str | None = None
    headers: dict[str, str] = attrs.Factory(dict)


@attrs.frozen
class Completion:
    """A non-streamed chat completion: ``payload`` as JSON, status 200."""

    payload: Any


def text_chunks(text: str, *, usage: dict[str, Any] | None = None) -> Stream:
    chunks: list[Any] = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    for part in (text[: len(text) // 2], text[len(text) // 2 :]):
        chunks.append({"choices": [{"index": 0, "delta": {"content": part}}]})
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if usage is not None:
        chunks.append({"choices": [], "usage": usage})
    return Stream(tuple(chunks))


def tool_call_chunks(*calls: tuple[str, str, str], usage: dict[str, Any] | None = None) -> Stream:
    """``(id, function name as sent, arguments JSON)`` each, arguments split in two."""
    chunks: list[Any] = []
    for index, (call_id, name, arguments) in enumerate(calls):
        half = len(arguments) // 2
        chunks.append(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": index,
                                    "id": call_id,
                                    "type": "function",
                                    "function": {"name": name, "arguments": arguments[:half]},
                                }
                            ]
                        },
                    }
                ]
            }
        )
        chunks.append(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {"index": index, "function": {"arguments": arguments[half:]}}
                            ]
                        },
                    }
                ]
            }
        )
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    if usage is not None:
        chunks.append({"choices": [], "usage": usage})
    return Stream(tuple(chunks))


def message_stream(
    *blocks: dict[str, Any],
    stop_reason: str | None = "end_turn",
    usage: dict[str, Any] | None = None,
    stop: bool = True,
) -> Stream:
    """A Messages API stream of ``blocks`` (text, thinking with its
    signature, tool_use with its input), each streamed in two deltas, then
    ``stop_reason`` and ``message_stop`` (unless not ``stop``)."""
    chunks: list[Any] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                            "usage": {"input_tokens": 10, "output_tokens": 1}},
            },
        ),
        ("ping", {"type": "ping"}),
    ]  # fmt: skip
    for index, block in enumerate(blocks):
        kind = block["type"]
        start = dict(block)
        if kind == "tool_use":
            start["input"] = {}
            text, delta, field = json.dumps(block["input"]), "input_json_delta", "partial_json"
        elif kind in ("text", "thinking"):
            start[kind] = ""
            start.pop("signature", None)
            text, delta, field = block[kind], f"{kind}_delta", kind
        else:
            text = ""
        chunks.append(
            ("content_block_start", {"type": "content_block_start", "index": index,
                                     "content_block": start})
        )  # fmt: skip
        for part in (text[: len(text) // 2], text[len(text) // 2 :]) if text else ():
            chunks.append(
                ("content_block_delta", {"type": "content_block_delta", "index": index,
                                         "delta": {"type": delta, field: part}})
            )  # fmt: skip
        if kind == "thinking" and block.get("signature"):
            chunks.append(
                ("content_block_delta", {"type": "content_block_delta", "index": index,
                                         "delta": {"type": "signature_delta",
                                                   "signature": block["signature"]}})
            )  # fmt: skip
        chunks.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    if stop_reason is not None:
        chunks.append(
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                               "usage": usage or {"output_tokens": 5}})
        )  # fmt: skip
    if stop:
        chunks.append(("message_stop", {"type": "message_stop"}))
    return Stream(tuple(chunks), done=False)


class ChatServer:
    def __init__(self) -> None:
        self.replies: list[Stream | Status | Completion] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: no request lines on stderr

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                with server._lock:
                    server.requests.append(body)
                    server.headers.append(dict(self.headers.items()))
                    reply = server.replies.pop(0) if server.replies else Status(500, "no reply")
                if isinstance(reply, Completion):
                    payload = json.dumps(reply.payload).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if isinstance(reply, Status):
                    if reply.raw:
                        payload, kind = str(reply.body).encode(), "text/plain"
                    else:
                        error = {"message": reply.body}
                        if reply.code is not None:
                            error["code"] = reply.code
                        payload = json.dumps({"error": error}).encode()
                        kind = "application/json"
                    self.send_response(reply.status)
                    self.send_header("Content-Type", kind)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    length = 2 * len(payload) if reply.stall else len(payload)
                    self.send_header("Content-Length", str(length))
                    self.end_headers()
                    self.wfile.write(payload)
                    if reply.stall:
                        self.wfile.flush()
                        self.close_connection = True
                        server._stopping.wait(30)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if reply.prefix:
                    self._chunk(reply.prefix)
                for chunk in reply.chunks:
                    kind, payload = chunk if isinstance(chunk, tuple) else (None, chunk)
                    data = payload if isinstance(payload, str) else json.dumps(payload)
                    line = (
                        f"data: {data}\n\n" if kind is None else f"event: {kind}\ndata: {data}\n\n"
                    )
                    self._chunk(line.encode())
                if reply.drop:
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if reply.done:
                    self._chunk(b"data: [DONE]\n\n")
                if reply.tail == "end":
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    return
                self.close_connection = True
                if reply.tail == "hang":
                    server._stopping.wait(30)
                elif reply.tail == "reset":
                    linger = struct.pack("ii", 1, 0)
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def add(self, *replies: Stream | Status | Completion) -> None:
        with self._lock:
            self.replies.extend(replies)

    @contextmanager
    def running(self) -> Iterator[ChatServer]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stopping.set()
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
