"""What the console's pages show, from a stored record and its events: pure
functions, no I/O, nothing rendered (the templates escape every value)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .._numbers import iso_instant as instant
from ..errors import Error
from ..kernel import RunEvent, RunRecord, thaw
from ..recovery import recover
from ..store import RunSummary

__all__ = [
    "asked",
    "event_view",
    "events_view",
    "run_row",
    "run_view",
    "timeline",
    "unreadable_row",
]

#: How much of one value a page shows (the rest is cut, said so).
_SHOWN: Final = 4000


def _json(value: Any) -> str:
    text = json.dumps(thaw(value), ensure_ascii=False, indent=2, default=str, sort_keys=True)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + f"\n… ({len(text)} characters)"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value if len(value) <= _SHOWN else value[:_SHOWN] + "…"
    if isinstance(value, list | tuple):
        parts = [
            str(block.get("text", "")) if isinstance(block, Mapping) and "text" in block
            else _json(block)
            for block in value
        ]  # fmt: skip
        return _text("\n".join(parts))
    return _json(value)


def run_row(record: RunRecord) -> dict[str, Any]:
    """One line of the runs page."""
    return {
        "run_id": record.run_id,
        "state": record.state,
        "incarnation": record.incarnation,
        "revision": record.revision,
        "work": f"{record.budget.used}/{record.budget.quota}",
        "messages": len(record.transcript),
        "pending": _pending(record) is not None,
        "deadline": instant(record.deadline),
    }


def unreadable_row(summary: RunSummary, error: Error) -> dict[str, Any]:
    """The runs page's line for a run whose record cannot be read: its
    summary, and why."""
    return {
        "run_id": summary.run_id,
        "state": summary.state,
        "incarnation": summary.incarnation,
        "revision": summary.revision,
        "work": "?",
        "messages": "?",
        "pending": False,
        "deadline": "",
        "unreadable": f"{error.error_class.value}: {error.message}",
    }


def _conversation(record: RunRecord) -> Mapping[str, Any]:
    context = record.context or {}
    conversation = context.get("conversation") if isinstance(context, Mapping) else None
    return conversation if isinstance(conversation, Mapping) else {}


def _pending(record: RunRecord) -> Mapping[str, Any] | None:
    pending = _conversation(record).get("pending_interaction")
    return pending if isinstance(pending, Mapping) and not record.terminal else None


def asked(record: RunRecord) -> str | None:
    """The id of the question the run waits on, if it waits."""
    pending = _pending(record)
    return None if pending is None else str(pending.get("id"))


def run_view(record: RunRecord, now: float) -> dict[str, Any]:
    """The run page's content: summary, transcript, intents, the pending
    question, and, for a run that is not terminal, what a recovery would
    find.  Only the record: ``provider_context`` and ``backend_context``
    are never stored, so never shown."""
    budget = record.budget
    left = None if record.deadline is None else max(0.0, record.deadline - now)
    return {
        "run_id": record.run_id,
        "state": record.state,
        "incarnation": record.incarnation,
        "revision": record.revision,
        "stop_reason": record.stop_reason or "-",
        "deadline": instant(record.deadline),
        "time_left": "-" if left is None or record.terminal else f"{left:.0f} s",
        "work": f"{budget.used} of {budget.quota} used",
        "reservations": ", ".join(sorted(budget.reservations)) or "none",
        "transcript": [_entry(message) for message in record.transcript],
        "intents": _intents(record),
        "pending": _question(record),
        "outcome": None if record.outcome is None else _json(record.outcome),
        "recovery": None if record.terminal else _recovery(record),
        "timeline": timeline(record, now),
    }


def _entry(message: Any) -> dict[str, Any]:
    """A transcript message: its role, its text, its tool calls and, for a
    tool message, its result or error."""
    if not isinstance(message, Mapping):
        return {"role": "?", "text": _json(message), "calls": [], "error": False}
    role = str(message.get("role", "?"))
    if role == "tool":
        result = message.get("result")
        error = isinstance(result, Mapping) and bool(result.get("is_error"))
        shown = result.get("content") if isinstance(result, Mapping) else result
        if error and isinstance(result, Mapping) and result.get("error") is not None:
            shown = result.get("error")
        return {
            "role": f"tool {message.get('name', '')}".strip(),
            "text": _text(shown),
            "calls": [],
            "error": error,
            "call_id": str(message.get("tool_call_id", "")),
        }
    content = message.get("content")
    calls = [
        {"id": str(b.get("id")), "name": str(b.get("name")), "arguments": _json(b.get("arguments"))}
        for b in (content if isinstance(content, list | tuple) else ())
        if isinstance(b, Mapping) and b.get("type") == "tool_call"
    ]
    text_blocks = (
        [b for b in content if not (isinstance(b, Mapping) and b.get("type") == "tool_call")]
        if isinstance(content, list | tuple)
        else content
    )
    return {"role": role, "text": _text(text_blocks), "calls": calls, "error": False}


def _intents(record: RunRecord) -> list[dict[str, Any]]:
    rows = []
    for effect_id, intent in record.intents.items():
        rows.append(
            {
                "effect": effect_id,
                "kind": intent.get("kind", "?"),
                "tool": intent.get("tool_name") or "-",
                "status": intent.get("status", "?"),
                "effect_class": intent.get("effect_class", "?"),
                "dispatch_state": intent.get("dispatch_state", "-"),
                "started": instant(intent.get("started_at")),
                "settled": instant(intent.get("completed_at")),
            }
        )
    return rows


def _question(record: RunRecord) -> dict[str, Any] | None:
    """The pending interaction: for a permission, the tool, its arguments
    and their digest, as the person deciding must see them."""
    pending = _pending(record)
    if pending is None:
        return None
    request = pending.get("request")
    request = request if isinstance(request, Mapping) else {}
    operation = request.get("operation")
    operation = operation if isinstance(operation, Mapping) else {}
    return {
        "id": str(pending.get("id")),
        "kind": str(request.get("kind", "?")),
        "tool": str(operation.get("tool_name", "-")),
        "arguments": _json(operation.get("arguments")),
        "digest": str(operation.get("arguments_digest", "-")),
        "request": _json(request),
        "asked": instant(pending.get("requested_at")),
    }


def _recovery(record: RunRecord) -> dict[str, Any]:
    """What a takeover would find, were the run's host gone (read only:
    nothing is fenced here)."""
    try:
        report = recover(record, incarnation=record.incarnation + 1)
    except Error as error:  # a record recovery refuses: shown, not raised
        return {"classification": f"not classified: {error.message}", "effects": []}
    if report.uncertain_effects:
        found = "uncertain: " + ", ".join(report.uncertain_effects) + " (a reconciler decides)"
    elif report.effects:
        found = "nothing uncertain: the effects in flight may be withdrawn or resumed"
    else:
        found = "nothing in flight"
    effects = [
        {
            "effect": e.effect_id,
            "kind": e.kind,
            "effect_class": e.effect_class,
            "dispatch_state": e.dispatch_state,
            "status": e.status,
        }
        for e in report.effects
    ]
    return {"classification": found, "effects": effects}


def timeline(record: RunRecord, now: float) -> list[dict[str, Any]]:
    """Bars for the provider attempts, tool calls and the open wait, as
    fractions of the run's span (a bar still open ends now)."""
    bars: list[tuple[str, str, float, float]] = []
    for effect_id, intent in record.intents.items():
        start, end = intent.get("started_at"), intent.get("completed_at")
        if not isinstance(start, int | float):
            continue
        kind = str(intent.get("kind", "effect"))
        label = intent.get("tool_name") or effect_id
        bars.append((kind, str(label), float(start), float(end) if end is not None else now))
    pending = _pending(record)
    asked = pending.get("requested_at") if pending is not None else None
    if isinstance(asked, int | float):
        bars.append(("wait", f"waiting: {pending.get('id')}", float(asked), now))  # type: ignore[union-attr]
    if not bars:
        return []
    first = min(b[2] for b in bars)
    last = max(*(b[3] for b in bars), first + 1e-6)
    span = last - first
    return [
        {
            "kind": kind,
            "label": label,
            "left": round(100 * (start - first) / span, 2),
            "width": max(round(100 * (end - start) / span, 2), 0.5),
            "seconds": f"{end - start:.3f} s",
        }
        for kind, label, start, end in sorted(bars, key=lambda b: b[2])
    ]


def event_view(event: RunEvent) -> dict[str, Any]:
    """One stored event as the live feed sends it."""
    payload = event.payload
    return {
        "sequence": event.sequence,
        "type": event.type,
        "at": instant(event.occurred_at),
        "state": str(payload.get("state", "")),
        "input": _json(payload.get("input")),
    }


def events_view(events: Sequence[RunEvent]) -> list[dict[str, Any]]:
    return [event_view(event) for event in events]
