"""The kernel's commands, one typed class per kind.

``Command(kind, at, input)`` (the generic form of the public API) reads as
one of these (:func:`typed`); the runtime builds them directly.  A field not
given is :data:`UNSET`, as a key missing from a generic command's input.  The
kernel checks values in its handlers, the same for both forms, so a typed
command holds what it was given (what the kernel appends or keeps as given,
the transcript, usage and authority, frozen as set), and every value is
checked as JSON data before a record or event holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeAlias, final, get_args

import attrs

from ..errors import Error, ErrorClass
from ._fields import _at
from ._frozen import _KEPT, FrozenDict, FrozenList, _accelerator, freeze
from ._records import Command

__all__ = [
    "COMMANDS",
    "UNSET",
    "Admit",
    "Cancel",
    "ChildSettled",
    "CleanupSettled",
    "ConversationUpdated",
    "DeadlineExceeded",
    "Finish",
    "KernelCommand",
    "ProviderCompleted",
    "build_command",
    "ProviderStarted",
    "Start",
    "ToolCompleted",
    "ToolInvoked",
    "WaitResolved",
    "WaitStarted",
    "event_input",
    "typed",
]


@final
class _Unset:
    """The value of a field not given (``None`` is JSON null, a value)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self) -> str:
        return "UNSET"


#: A field not given: as a key missing from a generic command's input.
UNSET: Final = _Unset()


def _json(value: Any) -> Any:
    """A field the kernel keeps as given (transcript and usage items, an
    authority): frozen, and so checked, as it is set."""
    return value if value is UNSET else freeze(value, "command input")


@attrs.frozen(kw_only=True)
class _Base:
    """What every command has: the time ``at`` (the caller's clock; the kernel
    never reads one) and, optionally, the run and incarnation it is meant
    for (a command naming another is refused)."""

    kind = ""  # the subclass's

    at: float = attrs.field(validator=_at)
    run_id: Any = UNSET
    incarnation: Any = UNSET
    #: the generic command's frozen input this one was read from (its event's input)
    _source: FrozenDict | None = attrs.field(init=False, default=None, eq=False, repr=False)


@final
@attrs.frozen(kw_only=True)
class Admit(_Base):
    """Admit a queued run: ``state`` ``"queued"`` (default) or ``"running"``,
    its ``deadline`` and its first conversation state."""

    kind = "admit"
    state: Any = UNSET
    deadline: Any = UNSET
    conversation: Any = UNSET
    messages: Any = attrs.field(default=UNSET, converter=_json)
    usage: Any = attrs.field(default=UNSET, converter=_json)


@final
@attrs.frozen(kw_only=True)
class Start(_Base):
    """Move an admitted run to ``running``."""

    kind = "start"


@final
@attrs.frozen(kw_only=True)
class ConversationUpdated(_Base):
    """A checkpoint: the conversation state, transcript and usage appended,
    and a later ``execution_deadline``."""

    kind = "conversation_updated"
    conversation: Any = UNSET
    messages: Any = attrs.field(default=UNSET, converter=_json)
    usage: Any = attrs.field(default=UNSET, converter=_json)
    execution_deadline: Any = UNSET


@final
@attrs.frozen(kw_only=True)
class ProviderStarted(_Base):
    """Start a provider attempt (a new step) in turn ``turn_id``."""

    kind = "provider_started"
    turn_id: Any = UNSET


@final
@attrs.frozen(kw_only=True)
class ProviderCompleted(_Base):
    """Complete the active attempt with its ``result``; ``final``: the run
    completes with ``outcome``."""

    kind = "provider_completed"
    attempt_id: Any = UNSET
    result: Any = UNSET
    final: Any = UNSET
    outcome: Any = UNSET
    conversation: Any = UNSET
    messages: Any = attrs.field(default=UNSET, converter=_json)
    usage: Any = attrs.field(default=UNSET, converter=_json)


@final
@attrs.frozen(kw_only=True)
class ToolInvoked(_Base):
    """Record a tool's intent in the current step, before it runs."""

    kind = "tool_invoked"
    step_id: Any = UNSET
    tool_name: Any = UNSET
    tool_revision: Any = UNSET
    tool_call_id: Any = UNSET
    turn_id: Any = UNSET
    arguments_digest: Any = UNSET
    effective_authority: Any = attrs.field(default=UNSET, converter=_json)
    effect_class: Any = UNSET
    dispatch_state: Any = UNSET


@final
@attrs.frozen(kw_only=True)
class ToolCompleted(_Base):
    """Settle an active invocation with its ``result``."""

    kind = "tool_completed"
    invocation_id: Any = UNSET
    result: Any = UNSET
    conversation: Any = UNSET
    messages: Any = attrs.field(default=UNSET, converter=_json)
    usage: Any = attrs.field(default=UNSET, converter=_json)


@final
@attrs.frozen(kw_only=True)
class WaitStarted(_Base):
    """Wait on ``dependency`` (child agents, AGT)."""

    kind = "wait_started"
    dependency: Any = UNSET


@final
@attrs.frozen(kw_only=True)
class WaitResolved(_Base):
    """End the active wait ``wait_id``."""

    kind = "wait_resolved"
    wait_id: Any = UNSET


@final
@attrs.frozen(kw_only=True)
class ChildSettled(_Base):
    """Record an owned child's settlement."""

    kind = "child_settled"
    child_id: Any = UNSET
    outcome: Any = UNSET


@final
@attrs.frozen(kw_only=True)
class Finish(_Base):
    """End a settled run ``completed`` or ``failed`` with its ``outcome``."""

    kind = "finish"
    status: Any = UNSET
    outcome: Any = UNSET


@final
@attrs.frozen(kw_only=True)
class Cancel(_Base):
    """Stop the run for ``reason`` (``"cancelled"`` by default)."""

    kind = "cancel"
    reason: Any = UNSET


@final
@attrs.frozen(kw_only=True)
class DeadlineExceeded(_Base):
    """Stop the run at its deadline (the reason is always ``deadline_exceeded``)."""

    kind = "deadline_exceeded"
    reason: Any = UNSET


@final
@attrs.frozen(kw_only=True)
class CleanupSettled(_Base):
    """End a stopping run: ``certainty`` ``"confirmed"`` with the ``settled``
    work, or ``"uncertain"`` with ``evidence``."""

    kind = "cleanup_settled"
    certainty: Any = UNSET
    settled: Any = UNSET
    evidence: Any = UNSET


#: Any one of the kernel's commands (for ``match`` and annotations).
KernelCommand: TypeAlias = (
    Admit
    | Start
    | ConversationUpdated
    | ProviderStarted
    | ProviderCompleted
    | ToolInvoked
    | ToolCompleted
    | WaitStarted
    | WaitResolved
    | ChildSettled
    | Finish
    | Cancel
    | DeadlineExceeded
    | CleanupSettled
)

#: Every command kind and its class.
COMMANDS: Final[Mapping[str, type[KernelCommand]]] = {
    cls.kind: cls for cls in get_args(KernelCommand)
}

#: Per class, its input fields (all but the time) in order: what a generic
#: input may set, and what its event shows when set.
_ORDER: Final = {
    cls: tuple(f.name for f in attrs.fields(cls) if f.init and f.name != "at")
    for cls in COMMANDS.values()
}


def _configured() -> Any:
    """The C accelerator's ``command`` builder, configured with every
    command class whose fields but ``at`` all default to ``UNSET``, or
    ``None``."""
    build = getattr(_accelerator, "command", None)
    if build is None:  # pragma: no cover - exercised where no compiler was available
        return None
    specs = tuple(
        (
            cls,
            cls(at=0.0),
            tuple(
                (f.name, f.converter is _json)
                for f in attrs.fields(cls)
                if f.init and f.name != "at"
            ),
        )
        for cls in COMMANDS.values()
        if all(f.default is UNSET for f in attrs.fields(cls) if f.init and f.name != "at")
    )
    try:
        _accelerator.configure_commands(specs)
    except TypeError:  # pragma: no cover - a layout it does not know
        return None
    return build


_fast_make: Final = _configured()


def build_command(cls: type[KernelCommand], at: float, fields: Mapping[str, Any]) -> KernelCommand:
    """``cls(at=at, **fields)``, the same command: built by the C
    accelerator (a copy of the class's blank instance with the fields set)
    when every value is one the class's ``__init__`` keeps as it is, else by
    ``__init__`` itself, which checks and words any error.  The runtime's
    way to build the commands of a step (attrs' keyword ``__init__`` costs
    more than the kernel's transition)."""
    if _fast_make is not None:
        made = _fast_make(cls, at, fields)
        if made is not NotImplemented:
            return made  # type: ignore[no-any-return]
    return cls(at=at, **fields)


def typed(command: Command) -> KernelCommand:
    """The typed command a generic ``Command`` stands for.  Keys its kind
    does not know stay in its event's input; ``validation`` "unknown command"
    for a kind that does not exist."""
    kind = command.kind
    cls = COMMANDS.get(kind) if type(kind) is str else None
    if cls is None:
        raise Error(
            ErrorClass.VALIDATION,
            "unknown command",
            {"command": kind[:100] if type(kind) is str else repr(kind)[:100]},
        )
    given = command.input
    fields = _ORDER[cls]
    new = cls(at=command.at, **{k: v for k, v in given.items() if k in fields})
    object.__setattr__(new, "_source", given)
    return new


#: Input keys whose (possibly large) values events summarise, so the event
#: log does not repeat the transcript at every checkpoint.
DIGESTED: Final = frozenset({"conversation", "result", "messages", "usage"})
#: The summaries of mappings without a ``"messages"`` list, by their keys in
#: order (a conversation state, a tool result or a response has the same few
#: keys at every step): frozen, shared by every event showing one.
_KEY_SUMMARIES: Final[dict[tuple[str, ...], FrozenDict]] = {}


#: The summaries of short lists (frozen: shared by every event showing one).
_ITEMS: Final = tuple(FrozenDict({"items": n}) for n in range(16))


def _summary(value: Any) -> FrozenDict:
    """What an event says of a large input: its shape, in constant time."""
    kind = type(value)
    if kind is FrozenDict or (kind is not FrozenList and isinstance(value, Mapping)):
        keys = tuple(value)
        messages = value.get("messages")
        if isinstance(messages, tuple | list):
            listed = FrozenList(sorted(keys)[:32])
            return FrozenDict({"keys": listed, "messages": len(messages)})
        summary = _KEY_SUMMARIES.get(keys)
        if summary is None:
            summary = FrozenDict({"keys": FrozenList(sorted(keys)[:32])})
            if len(_KEY_SUMMARIES) < 256:
                _KEY_SUMMARIES[keys] = summary
        return summary
    if type(value) is FrozenList or isinstance(value, list | tuple):
        n = len(value)
        return _ITEMS[n] if n < len(_ITEMS) else FrozenDict({"items": n})
    return FrozenDict({"type": type(value).__name__})


def _checked(value: Any) -> Any:
    return freeze(value, "command input")


def _make_event_input(cls: type[KernelCommand]) -> Any:
    """A straight-line ``event_input`` for ``cls``: each set field, a large
    one summarised, any other value not frozen or ASCII text checked."""
    namespace = {
        "UNSET": UNSET,
        "FrozenDict": FrozenDict,
        "summary": _summary,
        "checked": _checked,
        "as_is": _KEPT,  # frozen already, or a leaf needing no check
        "str": str,
        "type": type,
    }
    lines = ["def event_input(c):", "    d = {}"]
    for name in _ORDER[cls]:
        lines += [f"    v = c.{name}", "    if v is not UNSET:"]
        if name in DIGESTED:
            lines.append(f"        d[{name!r}] = summary(v)")
        else:
            lines.append(
                f"        d[{name!r}] = v if type(v) in as_is or "
                "(type(v) is str and v.isascii()) else checked(v)"
            )
    lines.append("    return FrozenDict(d)")
    exec("\n".join(lines), namespace)  # code built from our own field names only
    return namespace["event_input"]


_EVENT_INPUTS: Final = {cls: _make_event_input(cls) for cls in COMMANDS.values()}


def event_input(command: KernelCommand) -> FrozenDict:
    """The input the command's event shows: the generic command's input, or
    the typed command's set fields, large values summarised.  Checks a typed
    command's other values as JSON data."""
    source = command._source
    if source is None:
        built: FrozenDict = _EVENT_INPUTS[type(command)](command)
        return built
    if not DIGESTED.intersection(source):
        return source
    return FrozenDict({k: (_summary(v) if k in DIGESTED else v) for k, v in source.items()})
