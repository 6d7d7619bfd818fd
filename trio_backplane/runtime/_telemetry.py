"""OpenTelemetry spans and metrics for conversations, through the
``opentelemetry-api`` package only (the ``otel`` extra; the host configures
the SDK and its exporters), named by the GenAI semantic conventions.

A conversation records through a :class:`RunRecorder` its engine calls at a
handful of points (the run, each turn, provider attempt, tool execution,
human wait and store commit), each span parented explicitly (the engine's
tasks do not share an ambient context), and made current while a provider
streams or a backend runs, so their own instrumentation nests under it.
Without a :class:`Telemetry`, nothing here runs and nothing is imported.

What reaches an attribute: ids, names, counts, classes of errors and their
messages as the run publishes them.  Never a provider context, a backend
context, a schema or a credential; message and argument content only with
``capture_content=True`` (off by default, as the conventions ask).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final, final

import attrs

from .._version import __version__
from ..errors import Error, ErrorClass
from ..kernel import freeze

__all__ = ["TRACE_KEY", "RunRecorder", "Telemetry", "traced"]

_SCOPE: Final = "trio_backplane"
#: The conversation state key a run's trace is kept under, so an
#: incarnation that resumes it links to the one before.
TRACE_KEY: Final = "trace"
#: the globally configured providers' Telemetry (:meth:`Telemetry.configured`)
_CONFIGURED: dict[tuple[int, ...], tuple[list[Any], Telemetry]] = {}
_DEFAULT_PROVIDERS: Final = frozenset(
    {"ProxyTracerProvider", "NoOpTracerProvider", "_ProxyMeterProvider", "NoOpMeterProvider"}
)


@functools.cache
def _otel() -> tuple[Any, Any, Any]:
    """``opentelemetry``'s ``trace``, ``metrics`` and ``context`` modules
    (imported once, the first time telemetry is asked for)."""
    try:
        return tuple(  # type: ignore[return-value]
            importlib.import_module(f"opentelemetry.{name}")
            for name in ("trace", "metrics", "context")
        )
    except ImportError as exc:
        raise Error(
            ErrorClass.UNSUPPORTED_CAPABILITY,
            "telemetry needs opentelemetry-api: install the 'otel' extra",
            {"extra": "otel"},
        ) from exc


@final
class Telemetry:
    """Where conversations send spans and metrics: ``tracer_provider`` and
    ``meter_provider`` (default: the globally configured ones).
    ``capture_content``: message and argument content on spans
    (``gen_ai.input.messages``, ``gen_ai.tool.call.arguments``, ...);
    off by default.  ``agent_name`` names the run spans
    (``invoke_agent <agent_name>``)."""

    __slots__ = ("agent_name", "capture_content", "instruments", "tracer")

    def __init__(
        self,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        capture_content: bool = False,
        agent_name: str = "backplane",
    ) -> None:
        trace, metrics, _ = _otel()
        tracers = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        meters = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        self.tracer = tracers.get_tracer(_SCOPE, __version__)
        self.instruments = _Instruments(meters.get_meter(_SCOPE, __version__))
        self.capture_content = bool(capture_content)
        self.agent_name = str(agent_name)

    @classmethod
    def configured(cls) -> Telemetry | None:
        """The globally configured SDK's telemetry, or ``None`` when none is
        configured: then nothing is recorded and, unless the host imported
        it, nothing of ``opentelemetry`` is imported (a conversation opened
        without ``telemetry=`` costs nothing)."""
        trace, metrics = sys.modules.get("opentelemetry.trace"), None
        if trace is None:
            return None
        metrics = sys.modules.get("opentelemetry.metrics")
        providers = [trace.get_tracer_provider()]
        if metrics is not None:
            providers.append(metrics.get_meter_provider())
        if all(type(p).__name__ in _DEFAULT_PROVIDERS for p in providers):
            return None
        # one Telemetry (one set of instruments) for as long as the host
        # keeps the same providers: not a new one per conversation
        key = tuple(id(p) for p in providers)
        held = _CONFIGURED.get(key)
        if held is None or held[0] != providers:
            _CONFIGURED.clear()
            held = _CONFIGURED[key] = (providers, cls())
        return held[1]

    def recorder(self, run_id: str, incarnation: int, *, model: Any = None) -> RunRecorder:
        """A new recorder for one incarnation of ``run_id``."""
        return RunRecorder(self, run_id, incarnation, model=model)


@final
class _Instruments:
    """The metrics, created once per :class:`Telemetry`."""

    __slots__ = ("cleanups", "commits", "operations", "runs", "tokens", "tools", "waiting", "work")

    def __init__(self, meter: Any) -> None:
        histogram, counter = meter.create_histogram, meter.create_counter
        self.operations = histogram(
            "gen_ai.client.operation.duration", unit="s", description="provider attempts"
        )
        self.tokens = histogram("gen_ai.client.token.usage", unit="{token}")
        self.tools = histogram("gen_ai.execute_tool.duration", unit="s")
        self.commits = histogram("backplane.commit.duration", unit="s")
        self.work = histogram("backplane.run.work_used", unit="{unit}")
        self.runs = counter("backplane.runs", unit="{run}", description="runs by final state")
        self.cleanups = counter(
            "backplane.cleanups", unit="{run}", description="runs by what became of their resources"
        )
        self.waiting = meter.create_up_down_counter(
            "backplane.interactions.waiting", unit="{interaction}"
        )


def _text(value: Any) -> str:
    """Content as an attribute value: JSON text (``capture_content`` only)."""
    try:
        return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)[:65536]
    except (TypeError, ValueError):
        return "<not JSON data>"


@final
class RunRecorder:
    """One incarnation's spans: started and ended by the engine, each with
    its parent.  A span left open when the run ends (a stop cut it) ends
    with the run, its status naming why."""

    __slots__ = ("_open", "_run", "_started", "attributes", "model", "telemetry", "trace")

    def __init__(
        self, telemetry: Telemetry, run_id: str, incarnation: int, *, model: Any = None
    ) -> None:
        self.telemetry = telemetry
        self.model = model if isinstance(model, str) else None
        self.attributes = {
            "gen_ai.conversation.id": run_id,
            "backplane.run.id": run_id,
            "backplane.run.incarnation": incarnation,
        }
        self._run: Any = None
        #: the run span's trace and span ids, kept in the run
        self.trace: dict[str, str] | None = None
        #: open spans by key (``turn:<id>``, ``chat:<id>``, ``tool:<id>``, ...)
        self._open: dict[str, Any] = {}
        self._started: dict[str, float] = {}

    # -- spans ---------------------------------------------------------------

    def _start(
        self, key: str, name: str, parent: Any, attributes: Mapping[str, Any], **kw: Any
    ) -> Any:
        telemetry = self.telemetry
        context = _otel()[0].set_span_in_context(parent) if parent is not None else None
        span = telemetry.tracer.start_span(
            name, context=context, attributes={**self.attributes, **attributes}, **kw
        )
        self._open[key] = span
        self._started[key] = _now()
        return span

    def _end(self, key: str, error: Any = None, **attributes: Any) -> float | None:
        """End the span ``key`` (if open): its status, its duration."""
        span = self._open.pop(key, None)
        started = self._started.pop(key, None)
        if span is None or started is None:
            return None
        for name, value in attributes.items():
            if value is not None:
                span.set_attribute(name, value)
        if error is not None:
            _fail(span, error)
        span.end()
        return _now() - started

    def parent(self, invocation_id: str | None, turn_id: str | None = None) -> Any:
        """The span a new one nests under: the executing tool's, else the
        turn's, else the run's."""
        for key in (f"tool:{invocation_id}", f"turn:{turn_id}"):
            span = self._open.get(key)
            if span is not None:
                return span
        return self._run

    @contextlib.contextmanager
    def current(self, key: str) -> Iterator[None]:
        """Make span ``key`` the current one in this task (a provider's or a
        backend's own spans nest under it)."""
        span = self._open.get(key)
        if span is None:
            yield
            return
        trace, _, context = _otel()
        token = context.attach(trace.set_span_in_context(span))
        try:
            yield
        finally:
            context.detach(token)

    # -- the run ---------------------------------------------------------------

    def run_started(self, previous: Mapping[str, Any] | None) -> dict[str, str]:
        """Start the run span (a link to ``previous``, the trace of the
        incarnation this one resumes); the trace to keep in the run."""
        telemetry = self.telemetry
        links = _links(previous)
        name = f"invoke_agent {telemetry.agent_name}"
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": telemetry.agent_name,
        }
        self._run = self._start("run", name, _otel()[0].get_current_span(), attributes, links=links)
        context = self._run.get_span_context()
        self.trace = {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}
        return self.trace

    def run_ended(self, state: str, error: Any, *, work_used: int, cleanup: str) -> None:
        """End every span left open, then the run's."""
        for key in [k for k in self._open if k != "run"]:
            self._end(key, {"class": "cancelled", "message": f"the run ended {state}"})
        instruments = self.telemetry.instruments
        instruments.runs.add(1, {"backplane.run.state": state})
        instruments.work.record(work_used, {"backplane.run.state": state})
        instruments.cleanups.add(1, {"backplane.cleanup": cleanup})
        failed = error if state not in ("completed", "cancelled") else None
        self._end("run", failed, **{"backplane.run.state": state, "backplane.cleanup": cleanup})

    # -- turns, attempts, tools, waits, commits --------------------------------

    def turn_started(self, turn_id: str) -> None:
        """Start the turn's span, once (a turn steering prolongs goes on in it)."""
        key = f"turn:{turn_id}"
        if key not in self._open:
            self._start(key, "turn", self._run, {"backplane.turn.id": turn_id})

    def turn_ended(self, turn_id: str, error: Error | None) -> None:
        self._end(f"turn:{turn_id}", None if error is None else error.to_dict())

    def chat_started(self, turn_id: str, attempt_id: str, messages: Any) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "backplane.attempt.id": attempt_id,
        }
        if self.model is not None:
            attributes["gen_ai.request.model"] = self.model
        if self.telemetry.capture_content:
            attributes["gen_ai.input.messages"] = _text(messages)
        name = "chat" if self.model is None else f"chat {self.model}"
        kind = _otel()[0].SpanKind.CLIENT
        self._start(f"chat:{attempt_id}", name, self.parent(None, turn_id), attributes, kind=kind)

    def chat_ended(self, attempt_id: str, usage: Any, error: Any, message: Any = None) -> None:
        tokens = _tokens(usage)
        content = _text(message) if self.telemetry.capture_content and message else None
        duration = self._end(
            f"chat:{attempt_id}",
            error,
            **{
                "gen_ai.usage.input_tokens": tokens[0],
                "gen_ai.usage.output_tokens": tokens[1],
                "gen_ai.output.messages": content,
            },
        )
        if duration is None:
            return
        instruments = self.telemetry.instruments
        labels = {"gen_ai.operation.name": "chat", **_error_type(error)}
        if self.model is not None:
            labels["gen_ai.request.model"] = self.model
        instruments.operations.record(duration, labels)
        for kind, count in zip(("input", "output"), tokens, strict=True):
            if count is not None:
                instruments.tokens.record(count, {**labels, "gen_ai.token.type": kind})

    def tool_started(self, operation: Any, caller: str | None) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": operation.tool_name,
            "gen_ai.tool.call.id": operation.tool_call_id,
            "gen_ai.tool.type": "function",
            "backplane.invocation.id": operation.invocation_id,
            "backplane.tool.revision": operation.tool_revision,
        }
        if caller is not None:
            attributes["backplane.invocation.caller"] = caller
        if self.telemetry.capture_content:
            attributes["gen_ai.tool.call.arguments"] = _text(operation.arguments)
        parent = self.parent(caller, operation.turn_id)
        name = f"execute_tool {operation.tool_name}"
        self._start(f"tool:{operation.invocation_id}", name, parent, attributes)

    def tool_ended(
        self, operation: Any, result: Any, timed_out: bool, stopped: str | None = None
    ) -> None:
        """``stopped``: the run's stop reason, when a stop cut the tool."""
        error = _outcome_error(result, timed_out)
        if error is None and stopped is not None:
            error = {"class": "cancelled", "message": f"the run stopped ({stopped})"}
        content = None
        if self.telemetry.capture_content and not isinstance(result, BaseException):
            content = _text(getattr(result, "content", None))
        duration = self._end(
            f"tool:{operation.invocation_id}", error, **{"gen_ai.tool.call.result": content}
        )
        if duration is not None:
            labels = {"gen_ai.tool.name": operation.tool_name, **_error_type(error)}
            self.telemetry.instruments.tools.record(duration, labels)

    def tool_refused(self, call_id: str, name: Any, turn_id: str, error: Error) -> None:
        """A call refused before it ran (unknown tool, invalid arguments,
        not authorized, approval denied): a span of its own, failed."""
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": str(name),
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
        }
        key = f"refused:{call_id}"
        self._start(key, f"execute_tool {name}", self.parent(None, turn_id), attributes)
        self._end(key, error.to_dict())

    def wait_started(
        self, interaction_id: str, request: Any, invocation_id: str | None, turn_id: str | None
    ) -> None:
        kind = request.get("kind") if isinstance(request, Mapping) else None
        attributes = {
            "backplane.interaction.id": interaction_id,
            "backplane.interaction.kind": str(kind),
        }
        parent = self.parent(invocation_id, turn_id)
        self._start(f"wait:{interaction_id}", "await_human", parent, attributes)
        self.telemetry.instruments.waiting.add(1)

    def wait_ended(self, interaction_id: str, answered: bool) -> None:
        if (
            self._end(f"wait:{interaction_id}", **{"backplane.interaction.answered": answered})
            is not None
        ):
            self.telemetry.instruments.waiting.add(-1)

    def commit_started(self, revision: int, kinds: list[str]) -> Any:
        attributes = {"backplane.commit.revision": revision, "backplane.commit.commands": kinds}
        return self._start(f"commit:{revision}", "commit", self._run, attributes)

    def commit_ended(self, revision: int, error: Error | None) -> None:
        duration = self._end(f"commit:{revision}", None if error is None else error.to_dict())
        if duration is not None:
            self.telemetry.instruments.commits.record(duration, _error_type(error))


def traced(conversation: Any, state: Any) -> Any:
    """``conversation`` keeping the run's trace (``state.telemetry``'s),
    for the incarnation that may resume it: the same state without one."""
    recorder = state.telemetry
    if recorder is None or recorder.trace is None:
        return conversation
    other = conversation.other
    if other.get(TRACE_KEY) == recorder.trace:
        return conversation
    return attrs.evolve(conversation, other=freeze({**other, TRACE_KEY: recorder.trace}))


def _now() -> float:
    return time.monotonic()


def _links(previous: Mapping[str, Any] | None) -> list[Any]:
    """A link to the trace of the incarnation a resumed run goes on from."""
    if not isinstance(previous, Mapping):
        return []
    trace = _otel()[0]
    try:
        context = trace.SpanContext(
            trace_id=int(str(previous["trace_id"]), 16),
            span_id=int(str(previous["span_id"]), 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    except (KeyError, ValueError):
        return []
    return [trace.Link(context, {"backplane.link": "previous_incarnation"})]


def _fail(span: Any, error: Any) -> None:
    """Mark ``span`` failed with a classed error (``Error.to_dict`` data)."""
    data = error.to_dict() if isinstance(error, Error) else error
    cls = str(data.get("class", "error")) if isinstance(data, Mapping) else "error"
    message = str(data.get("message", "")) if isinstance(data, Mapping) else ""
    trace = _otel()[0]
    span.set_attribute("error.type", cls)
    span.add_event(
        "exception", {"exception.type": f"trio_backplane.Error.{cls}", "exception.message": message}
    )
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{cls}: {message}"[:300]))


def _error_type(error: Any) -> dict[str, str]:
    if error is None:
        return {}
    data = error.to_dict() if isinstance(error, Error) else error
    return {"error.type": str(data.get("class", "error")) if isinstance(data, Mapping) else "error"}


def _outcome_error(result: Any, timed_out: bool) -> Any:
    """The error a backend's outcome stands for, as JSON data, or ``None``."""
    if timed_out:
        return {"class": "timeout", "message": "tool outlived effect_timeout"}
    if isinstance(result, Error):
        return result.to_dict()
    if isinstance(result, BaseException):
        return {"class": "execution_failure", "message": type(result).__name__}
    if type(result).__name__ == "Rejection":
        return {"class": str(getattr(result, "error_class", "forbidden")), "message": "rejected"}
    if getattr(result, "is_error", False):
        return {"class": "execution_failure", "message": "the tool returned an error"}
    return None


def _tokens(usage: Any) -> tuple[int | None, int | None]:
    """Input and output tokens of a provider's last usage report."""
    if isinstance(usage, list | tuple):
        usage = usage[-1] if usage else None
    if not isinstance(usage, Mapping):
        return None, None
    found = []
    for names in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
        value = next((usage[n] for n in names if type(usage.get(n)) is int), None)
        found.append(value)
    return found[0], found[1]
