"""What ``open_conversation`` is given, checked before it calls anything:
the options, the store, provider and hooks, a stored run or a transcript."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import attrs

from .._numbers import is_seconds
from ..errors import Error, ErrorClass, require_methods
from ..kernel import RunRecord, freeze
from ._clock import DurableClock, check_wall_clock
from ._telemetry import Telemetry

__all__ = [
    "HOST_RESOLVER",
    "MAX_TIMEOUT",
    "Options",
    "check_inputs",
    "check_options",
]

MAX_TIMEOUT: Final = 3600.0
#: Who resolves approvals from ``resolve``; no run may be named so.
HOST_RESOLVER: Final = "host"


def _check_timeout(name: str, value: Any) -> float:
    if not is_seconds(value, MAX_TIMEOUT):
        raise Error(
            ErrorClass.VALIDATION,
            f"{name} must be a finite positive timeout",
            {"option": name, "maximum": MAX_TIMEOUT},
        )
    return float(value)


def check_inputs(
    run_id: str,
    store: Any,
    provider: Any,
    *,
    hooks: Any,
    context: Any,
    provider_context: Any,
    run: Any,
    messages: Any,
    resume: Any = None,
) -> list[Any] | None:
    """What ``open_conversation`` is given to work with, checked before it
    calls anything: a run id other than the host's, a store with ``create``
    and ``commit``, a provider with ``stream``, hooks whose ``prompt`` and
    ``stop`` (when present) are callables, a mapping (or ``None``) as
    context without the reserved ``conversation`` key, a mapping (or
    ``None``) as the provider context, a ``RunRecord`` (or ``None``) as the
    stored run, and at most one of ``run``, ``resume`` and ``messages``.
    Returns the checked messages."""
    if run_id == HOST_RESOLVER:
        # The host answers approvals as resolver "host", and a
        # resolver named like the run is the model approving itself.
        raise Error(
            ErrorClass.VALIDATION,
            f"run id {HOST_RESOLVER!r} is reserved: it names the host resolving approvals",
            {"reason": "reserved_run_id"},
        )
    require_methods(store, "store", ("create", "commit"))
    require_methods(provider, "provider", ("stream",))
    for name in ("prompt", "stop"):
        hook = getattr(hooks, name, None)
        if hook is not None and not callable(hook):
            raise Error(
                ErrorClass.VALIDATION,
                f"hooks.{name} must be an async callable",
                {"argument": "hooks", "hook": name, "type": type(hook).__name__},
            )
    for name, value in (("context", context), ("provider_context", provider_context)):
        if value is not None and not isinstance(value, Mapping):
            raise Error(
                ErrorClass.VALIDATION,
                f"{name} must be a mapping or None",
                {"argument": name, "type": type(value).__name__},
            )
    if context is not None and "conversation" in context:
        raise Error(ErrorClass.VALIDATION, "context key 'conversation' is reserved")
    _check_records(run_id, run=run, resume=resume)
    if sum(value is not None for value in (run, messages, resume)) > 1:
        raise Error(
            ErrorClass.VALIDATION,
            "give one of run (a stored run), resume (a run taken over) or messages (a new one)",
        )
    return _check_messages(messages)


def _check_telemetry(telemetry: Any) -> Telemetry | None:
    """The telemetry given, else the globally configured SDK's (or none)."""
    if telemetry is None:
        return Telemetry.configured()
    if not isinstance(telemetry, Telemetry):
        raise Error(
            ErrorClass.VALIDATION,
            "telemetry must be a Telemetry or None",
            {"option": "telemetry", "type": type(telemetry).__name__},
        )
    return telemetry


def _check_records(run_id: str, **records: Any) -> None:
    """Each of ``records`` is ``None`` or a ``RunRecord`` of ``run_id``."""
    for name, value in records.items():
        if value is not None and not isinstance(value, RunRecord):
            raise Error(
                ErrorClass.VALIDATION,
                f"{name} must be a stored RunRecord or None",
                {"argument": name, "type": type(value).__name__},
            )
        if value is not None and value.run_id != run_id:
            raise Error(ErrorClass.VALIDATION, "run record belongs to another run_id")


def _check_messages(messages: Any) -> list[Any] | None:
    """The transcript a new run starts from (a replacement run receives the
    committed messages of the one it continues): a list or tuple of message
    objects, each with a ``role``.  Whether they are JSON data is checked with
    the rest of the run's context, before the store is called."""
    if messages is None:
        return None
    if not isinstance(messages, list | tuple):
        raise Error(
            ErrorClass.VALIDATION,
            "messages must be a list of transcript messages",
            {"type": type(messages).__name__},
        )
    # frozen first: a message that fails when read is classed, as the
    # context is (the context then takes these frozen copies as they are)
    messages = freeze(list(messages), "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or type(message.get("role")) is not str:
            raise Error(
                ErrorClass.VALIDATION,
                "each message must be an object with a role",
                {"index": index},
            )
    return list(messages)


@final
@attrs.frozen(kw_only=True)
class Options:
    """A conversation's checked options (``open_conversation``'s keywords)."""

    run_timeout: float
    effect_timeout: float
    commit_timeout: float
    cleanup_timeout: float
    output_limit: int
    provider_output_limit: float
    schema_admission: str
    work: int
    wall_clock: Callable[[], float]
    #: Trio's clock to ``wall_clock``, anchored once the options are checked
    clock: DurableClock
    #: where the run's spans and metrics go (``None``: nowhere)
    telemetry: Telemetry | None = None
    #: registries the run owns, closed on every terminal path
    resources: tuple[Any, ...] = ()


def check_options(
    *,
    work: Any,
    run_timeout: Any,
    effect_timeout: Any,
    commit_timeout: Any,
    cleanup_timeout: Any,
    output_limit: Any,
    provider_output_limit: Any,
    schema_admission: Any,
    wall_clock: Any,
    telemetry: Any = None,
) -> Options:
    timeouts = {
        "run_timeout": _check_timeout("run_timeout", run_timeout),
        "effect_timeout": _check_timeout("effect_timeout", effect_timeout),
        "commit_timeout": _check_timeout("commit_timeout", commit_timeout),
        "cleanup_timeout": _check_timeout("cleanup_timeout", cleanup_timeout),
    }
    if type(work) is not int or work < 1:
        raise Error(ErrorClass.VALIDATION, "work must be an int of at least 1", {"option": "work"})
    if type(output_limit) is not int or output_limit < 0:
        raise Error(
            ErrorClass.VALIDATION,
            "output_limit must be a non-negative int",
            {"option": "output_limit"},
        )
    if provider_output_limit is None:
        provider_limit: float = output_limit
    elif provider_output_limit == math.inf and type(provider_output_limit) is float:
        provider_limit = math.inf
    elif type(provider_output_limit) is int and provider_output_limit >= 0:
        provider_limit = provider_output_limit
    else:
        raise Error(
            ErrorClass.VALIDATION,
            "provider_output_limit must be a non-negative int or math.inf",
            {"option": "provider_output_limit"},
        )
    if schema_admission not in ("strict", "quarantine"):
        raise Error(ErrorClass.VALIDATION, "admission mode must be strict or quarantine")
    wall = check_wall_clock(wall_clock)
    return Options(
        output_limit=output_limit,
        provider_output_limit=provider_limit,
        schema_admission=schema_admission,
        work=work,
        wall_clock=wall,
        clock=DurableClock.anchored(wall),  # a clock that is not one is refused here
        telemetry=_check_telemetry(telemetry),
        run_timeout=timeouts["run_timeout"],
        effect_timeout=timeouts["effect_timeout"],
        commit_timeout=timeouts["commit_timeout"],
        cleanup_timeout=timeouts["cleanup_timeout"],
    )
