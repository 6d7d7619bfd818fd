"""A hand-written JSON-RPC MCP stdio server that sends what the SDK would not.

Run as ``python raw_mcp_server.py``; the environment says what it sends:

* ``RAW_TOOLS``: the JSON ``tools`` list of every ``tools/list`` page (the
  tools ``plain`` and ``calls`` if unset);
* ``RAW_PAGING``: ``"repeat"`` (every page names the cursor ``"again"``
  next) or ``"endless"`` (page ``n`` names cursor ``n + 1``, one tool each);
* ``RAW_RESULT``: the JSON ``tools/call`` result, sent as it is (default:
  the call's ``result`` argument if it has one, else the arguments
  received as ``structuredContent``);
* ``RAW_GARBAGE``: set to write one line of non-UTF-8 bytes before every
  ``tools/call`` response;
* ``RAW_CALL_DELAY``: seconds to wait before answering a ``tools/call``;
* ``RAW_CALL_LINE``: the whole ``tools/call`` response line, sent as it is
  with ``"__ID__"`` replaced by the request's id.

Every ``tools/call`` but one to ``calls`` is logged; a call to ``calls``
returns that log (``structuredContent: {"calls": [[name, arguments], ...]}``),
so a test can prove a request never reached the server.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

out = sys.stdout.buffer
DEFAULT = [{"name": name, "inputSchema": {"type": "object"}} for name in ("plain", "calls")]
TOOLS = json.loads(os.environ["RAW_TOOLS"]) if "RAW_TOOLS" in os.environ else DEFAULT
PAGING = os.environ.get("RAW_PAGING")
RESULT = os.environ.get("RAW_RESULT")
GARBAGE = "RAW_GARBAGE" in os.environ
CALL_DELAY = float(os.environ.get("RAW_CALL_DELAY", "0"))
CALL_LINE = os.environ.get("RAW_CALL_LINE")
calls: list[Any] = []


def send(key: Any, result: Any) -> None:
    out.write(json.dumps({"jsonrpc": "2.0", "id": key, "result": result}).encode() + b"\n")
    out.flush()


def listing(params: Any) -> dict[str, Any]:
    cursor = (params or {}).get("cursor")
    if PAGING == "repeat":
        return {"tools": TOOLS, "nextCursor": "again"}
    if PAGING == "endless":
        n = int(cursor or 0)
        tool = {"name": f"t{n}", "inputSchema": {"type": "object"}}
        return {"tools": [tool], "nextCursor": str(n + 1)}
    return {"tools": TOOLS}


def call(params: dict[str, Any]) -> Any:
    name, arguments = params["name"], params.get("arguments")
    if name == "calls":
        return {"content": [], "structuredContent": {"calls": calls}}
    calls.append([name, arguments])
    if GARBAGE:
        out.write(b"\xff\xfe not utf-8\n")
        out.flush()
    if RESULT is not None:
        return json.loads(RESULT)
    if isinstance(arguments, dict) and "result" in arguments:
        return arguments["result"]
    text = [{"type": "text", "text": "ok"}]
    return {"content": text, "structuredContent": {"arguments": arguments}}


for line in sys.stdin.buffer:
    message = json.loads(line)
    method, key = message.get("method"), message.get("id")
    if key is None:
        continue  # a notification
    if method == "initialize":
        version = message["params"]["protocolVersion"]
        capabilities = {"tools": {"listChanged": True}}
        info = {"name": "raw", "version": "1"}
        send(key, {"protocolVersion": version, "capabilities": capabilities, "serverInfo": info})
    elif method == "tools/list":
        send(key, listing(message.get("params")))
    elif method == "tools/call":
        time.sleep(CALL_DELAY)
        result = call(message["params"])  # logged
        if CALL_LINE is not None and message["params"]["name"] != "calls":
            out.write(CALL_LINE.replace('"__ID__"', json.dumps(key)).encode() + b"\n")
            out.flush()
            continue
        send(key, result)
    else:
        send(key, {})
