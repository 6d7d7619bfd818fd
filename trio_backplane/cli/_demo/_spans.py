"""``backplane demo --otel``: the run's OpenTelemetry spans, collected by
the SDK and printed once as a tree when the run ends."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ...runtime import Telemetry
from .._output import Out
from .._urls import UsageError

__all__ = ["SpanTree"]

#: the attributes a span's line shows, when it has them
_SHOWN = (
    "gen_ai.tool.call.id",
    "backplane.run.state",
    "backplane.interaction.kind",
    "gen_ai.usage.output_tokens",
    "error.type",
)


class SpanTree:
    """An SDK tracer provider keeping the demo's spans in memory, and the
    :class:`Telemetry` that records into it."""

    def __init__(self) -> None:
        try:
            trace_sdk = importlib.import_module("opentelemetry.sdk.trace")
            export = importlib.import_module("opentelemetry.sdk.trace.export")
            memory = importlib.import_module(
                "opentelemetry.sdk.trace.export.in_memory_span_exporter"
            )
        except ImportError:
            raise UsageError(
                "--otel needs the OpenTelemetry SDK: pip install opentelemetry-sdk"
            ) from None
        self._spans = memory.InMemorySpanExporter()
        self._provider = trace_sdk.TracerProvider()
        self._provider.add_span_processor(export.SimpleSpanProcessor(self._spans))
        self.telemetry = Telemetry(tracer_provider=self._provider, agent_name="backplane-demo")

    def show(self, out: Out) -> None:
        """Print every finished span under its parent, in start order."""
        spans = sorted(self._spans.get_finished_spans(), key=lambda span: span.start_time)
        children: dict[Any, list[Any]] = {}
        ids = {span.context.span_id for span in spans}
        for span in spans:
            parent = span.parent.span_id if span.parent is not None else None
            children.setdefault(parent if parent in ids else None, []).append(span)
        out.line(("spans ", "bold"), f"({len(spans)}, OpenTelemetry)")
        _walk(children, None, 1, lambda depth, span: out.line("  " * depth, *_line(span)))
        self._provider.shutdown()


def _walk(
    children: dict[Any, list[Any]], parent: Any, depth: int, show: Callable[[int, Any], None]
) -> None:
    for span in children.get(parent, ()):
        show(depth, span)
        _walk(children, span.context.span_id, depth + 1, show)


def _line(span: Any) -> tuple[Any, ...]:
    milliseconds = (span.end_time - span.start_time) / 1e6
    attributes = span.attributes or {}
    shown = [
        f"{name.rsplit('.', 1)[-1]}={attributes[name]}" for name in _SHOWN if name in attributes
    ]
    failed = span.status.status_code.name == "ERROR"
    return (
        (span.name, "bold red" if failed else "bold"),
        (f" {milliseconds:.1f} ms", "dim"),
        (" " + " ".join(shown) if shown else "", "dim"),
    )
