"""The demo's live view of a conversation's events, and its answers to approvals."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import trio

from ...errors import Error
from ...kernel import thaw
from .._output import Out, error_text, reason, short


class EventView:
    """Shows the event stream, one line per event (text deltas accumulated into
    one line), and answers permission interactions with ``approve``
    (``"yes"``, ``"no"``, or ``"ask"``: ``ask(prompt)`` returns the reply)."""

    def __init__(
        self,
        out: Out,
        conversation: Any,
        approve: str,
        ask: Callable[[str], str],
        log: TextIO | None,
    ) -> None:
        self.out = out
        self.conversation = conversation
        self.approve = approve
        self.ask = ask
        self.log = log
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.answers: list[str] = []
        #: why the ``--events`` log stopped (a full disk, ...): reported once
        #: the run is over, which it does not stop
        self.log_error: OSError | None = None

    def _flush(self) -> None:
        if self.thinking:
            self.out.line(("thinking ▸ ", "dim"), ("".join(self.thinking).strip(), "dim italic"))
            self.thinking.clear()
        if self.text:
            self.out.line(("assistant ▸ ", "bold magenta"), "".join(self.text).strip())
            self.text.clear()

    async def consume(self, events: Any) -> None:
        """Show (and log) every event of the subscription ``events`` until it ends."""
        async with events:
            async for event in events:
                if self.log is not None:
                    try:
                        self.log.write(event_json(event) + "\n")
                        self.log.flush()
                    except OSError as exc:
                        self.log_error, self.log = exc, None
                await self.show(event)
        self.out.stop()
        self._flush()

    async def show(self, event: Any) -> None:
        """Show one event; a permission request is answered before this returns."""
        kind, payload = event.type, event.payload
        if self._pending(kind, payload):
            return
        self.out.stop()
        self._flush()
        if kind == "interaction_requested":
            await self._interaction(payload)
            return
        for show_line in (self._model_line, self._tool_line, self._run_line):
            if show_line(kind, payload):
                return
        self.out.line((kind, "dim"), " ", (short(dict(payload)), "dim"))

    def _pending(self, kind: str, payload: Any) -> bool:
        """Whether ``kind`` is shown only by the spinner (or not at all) for now."""
        if kind == "content_text_delta":
            self.text.append(str(payload.get("delta", "")))
            self.out.spin("assistant ▸ " + "".join(self.text)[-70:])
        elif kind == "content_thinking_delta":
            self.thinking.append(str(payload.get("delta", "")))
            self.out.spin("thinking…")
        elif kind == "tool_call_started":
            call = payload.get("tool_call") or {}
            self.out.spin(f"the model is writing a call to {short(call.get('name'), 60)}…")
        else:
            return kind in ("tool_call_arguments_delta", "usage_updated")
        return True

    def _model_line(self, kind: str, payload: Any) -> bool:
        out = self.out
        if kind == "prompt_consumed":
            message = payload.get("message") or {}
            out.line(("user ▸ ", "bold cyan"), short(message.get("content"), 400))
        elif kind == "response_started":
            out.spin("waiting for the model…")
        elif kind == "tool_call_completed":
            call = payload.get("tool_call") or {}
            out.line(
                ("call ", "yellow"),
                (short(call.get("name"), 80), "bold"),
                " ",
                short(call.get("arguments")),
            )
        elif kind == "response_completed":
            usage = payload.get("usage")
            out.line(
                ("response completed", "dim"), (f"  usage {short(usage)}" if usage else "", "dim")
            )
        elif kind == "response_failed":
            out.line(("response failed  ", "bold red"), error_text(payload.get("error")))
        else:
            return False
        return True

    def _tool_line(self, kind: str, payload: Any) -> bool:
        out = self.out
        if kind == "tool_started":
            invocation = payload.get("invocation") or {}
            name = short(invocation.get("tool_name"), 80)
            out.line(("tool ▶ ", "blue"), (name, "bold"), " ", short(invocation.get("arguments")))
            out.spin(f"running {name}…")
        elif kind == "tool_update":
            out.line(("  · update ", "dim"), (short(dict(payload)), "dim"))
        elif kind == "tool_completed":
            message = payload.get("message") or {}
            result = message.get("result") or {}
            name = short(message.get("name"), 80)
            if result.get("is_error"):
                out.line(
                    ("tool ✗ ", "red"),
                    (name, "bold"),
                    "  ",
                    error_text(result.get("error")) or short(result.get("content")),
                )
            else:
                out.line(
                    ("tool ✓ ", "green"), (name, "bold"), "  ", short(result.get("content"), 120)
                )
        else:
            return False
        return True

    def _run_line(self, kind: str, payload: Any) -> bool:
        out = self.out
        if kind == "interaction_resolved":
            out.line(
                ("interaction resolved ", "dim"), (short(payload.get("interaction_id")), "dim")
            )
        elif kind in ("turn_completed", "run_completed"):
            out.line((kind.replace("_", " "), "bold green"))
        elif kind in ("turn_failed", "run_failed"):
            error = (payload.get("outcome") or {}).get("error") or payload.get("error")
            out.line((kind.replace("_", " ") + "  ", "bold red"), error_text(error))
        elif kind == "run_cancelled":
            out.line(("run cancelled  ", "bold red"), short(payload.get("state")))
        elif kind == "storage_failed":
            out.line(("storage failed  ", "bold red"), error_text(payload.get("error")))
        elif kind == "events_dropped":
            out.line((f"({payload.get('count')} transient events dropped)", "dim"))
        elif kind == "prompt_rejected":
            out.line(("prompt rejected  ", "red"), error_text(payload.get("error")))
        else:
            return False
        return True

    async def _interaction(self, payload: Any) -> None:
        request = payload.get("request") or {}
        if request.get("kind") != "permission":
            self.out.line(
                ("interaction ", "yellow"), short(dict(request)), " (answered: unsupported)"
            )
            answer = "unsupported"
        else:
            answer = await self._permission(request.get("operation") or {})
        self.answers.append(answer)
        try:
            await self.conversation.resolve(payload.get("interaction_id"), answer)
        except Error as error:
            self.out.line(("resolve refused  ", "red"), reason(error))

    async def _permission(self, operation: Mapping[str, Any]) -> str:
        tool = short(operation.get("tool_name"), 80)
        self.out.line(
            ("approval needed ", "bold yellow"),
            (tool, "bold"),
            " ",
            short(operation.get("arguments"), 400),
        )
        if self.approve == "ask":
            reply = await trio.to_thread.run_sync(
                self.ask, f"approve {tool}? [y/N] ", abandon_on_cancel=True
            )
            approved = reply.strip().lower() in ("y", "yes")
        else:
            approved = self.approve == "yes"
            self.out.line(
                ("  --approve ", "dim"), (self.approve, "bold"), (" answers for you", "dim")
            )
        answer = "approved" if approved else "denied"
        self.out.line(("  → ", "dim"), (answer, "bold green" if approved else "bold red"))
        return answer


def event_json(event: Any) -> str:
    """One event as the JSON line ``--events`` writes."""
    return json.dumps(
        {
            "type": event.type,
            "payload": thaw(event.payload),
            "run_id": event.run_id,
            "incarnation": event.incarnation,
            "turn_id": event.turn_id,
            "step_id": event.step_id,
            "attempt_id": event.attempt_id,
        },
        ensure_ascii=False,
        default=str,
    )


def ask_stdin(prompt: str) -> str:
    """Ask on the terminal (or read a line of standard input); EOF answers no."""
    sys.stdout.write(prompt)
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        sys.stdout.write("\n")
    return line
