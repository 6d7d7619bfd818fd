"""The conversation's state, typed: what a run's record holds of it.

The transcript and the usage reports are the record's own growing fields
(``RunRecord.transcript``, ``RunRecord.usage``); the rest is checkpointed in
``context["conversation"]``.  ``ConversationState`` reads both, and
:meth:`ConversationState.changes` turns a new state back into the inputs of a
kernel command: the small state when it changed, what was appended to the
transcript and the usage reports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, final

import attrs

from ..kernel import FrozenDict, FrozenList, RunRecord, appended, freeze

__all__ = ["ConversationState", "QueueName", "initial_context"]

_NO_ITEMS: Final = FrozenList()
_NOTHING: Final = FrozenDict()
#: The keys of ``context["conversation"]`` this module reads.
_KNOWN: Final = frozenset(
    {
        "steering",
        "follow_up",
        "queue_status",
        "turn_id",
        "pending_interaction",
        "resolved_interaction",
        "catalog_revision",
        "last_turn",
        "resources",
        # a schema version 1 record kept these here (the codec moves them)
        "messages",
        "usage",
    }
)

QueueName = Literal["steering", "follow_up"]


def listed(state: Mapping[str, Any], key: str) -> FrozenList:
    """The list ``state`` holds at ``key``: a stored conversation state is
    any mapping the kernel took, so a restored one may hold something else
    there, read as no items (the record itself is shown as stored)."""
    items = state.get(key)
    if type(items) is FrozenList:
        return items
    return FrozenList(items) if isinstance(items, list | tuple) else _NO_ITEMS


def _optional(value: Any, kind: type | tuple[type, ...]) -> Any:
    return value if isinstance(value, kind) else None


@final
@attrs.frozen(kw_only=True)
class ConversationState:
    """A conversation's committed state.  Values are frozen JSON data; a
    field a restored record holds with another type reads as its default."""

    #: the transcript (``RunRecord.transcript``)
    messages: FrozenList = _NO_ITEMS
    #: one provider usage report per response (``RunRecord.usage``)
    usage: FrozenList = _NO_ITEMS
    steering: FrozenList = _NO_ITEMS
    follow_up: FrozenList = _NO_ITEMS
    queue_status: str = "active"
    turn_id: str | None = None
    pending_interaction: Mapping[str, Any] | None = None
    resolved_interaction: Mapping[str, Any] | None = None
    #: ``None``: not recorded (a record the runtime did not write)
    catalog_revision: int | None = None
    last_turn: Mapping[str, Any] | None = None
    #: what running tools recorded of the resources they started (process
    #: groups, ...), for recovery after a crash of the host
    resources: FrozenList = _NO_ITEMS
    #: keys of the stored state this version does not read, kept as they are
    other: Mapping[str, Any] = _NOTHING
    #: the stored mapping this state was read from (``None``: built)
    source: Any = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def of(cls, record: RunRecord, previous: ConversationState | None = None) -> ConversationState:
        """The state ``record`` holds.  ``previous``: a state read from an
        earlier record; when ``record`` holds the very conversation mapping it
        was read from (a tool step changes only the growing fields), only
        those are taken from ``record``."""
        stored = record.context.get("conversation")
        if previous is not None and stored is previous.source and stored is not None:
            if previous.messages is record.transcript and previous.usage is record.usage:
                return previous
            return _regrown(previous, record.transcript, record.usage)
        source = stored
        if type(stored) is not FrozenDict and not isinstance(stored, Mapping):
            stored = _NOTHING
        status = stored.get("queue_status", "active")
        revision = stored.get("catalog_revision")
        return cls(
            messages=record.transcript,
            usage=record.usage,
            steering=listed(stored, "steering"),
            follow_up=listed(stored, "follow_up"),
            queue_status=status if type(status) is str else "active",
            turn_id=_optional(stored.get("turn_id"), str),
            pending_interaction=_optional(stored.get("pending_interaction"), Mapping),
            resolved_interaction=_optional(stored.get("resolved_interaction"), Mapping),
            catalog_revision=revision if type(revision) is int else None,
            last_turn=_optional(stored.get("last_turn"), Mapping),
            resources=listed(stored, "resources"),
            other=FrozenDict({k: v for k, v in stored.items() if k not in _KNOWN}),
            source=source,
        )

    def stored(self) -> FrozenDict:
        """What ``context["conversation"]`` holds of this state (frozen)."""
        data: dict[str, Any] = {
            "steering": self.steering,
            "follow_up": self.follow_up,
            "queue_status": self.queue_status,
            "turn_id": self.turn_id,
            "pending_interaction": self.pending_interaction,
            "catalog_revision": self.catalog_revision,
            "last_turn": self.last_turn,
        }
        if self.resolved_interaction is not None:
            data["resolved_interaction"] = self.resolved_interaction
        if self.resources:
            data["resources"] = self.resources
        data.update(self.other)
        return freeze(data)  # type: ignore[no-any-return]

    def changes(self, old: ConversationState) -> dict[str, Any]:
        """The command inputs taking a record holding ``old`` to this state:
        ``"conversation"`` when a field besides the growing ones differs,
        ``"messages"``/``"usage"``: what this state appended to ``old``'s
        (the kernel only appends to them)."""
        data: dict[str, Any] = {}
        if _small(self) != _small(old):
            data["conversation"] = self.stored()
        if self.messages is not old.messages:
            data["messages"] = FrozenList(self.messages[len(old.messages) :])
        if self.usage is not old.usage:
            data["usage"] = FrozenList(self.usage[len(old.usage) :])
        return data

    def with_message(self, message: Any) -> ConversationState:
        """This state with ``message`` (frozen) appended to the transcript."""
        return attrs.evolve(self, messages=appended(self.messages, message))

    def queued(self, queue: QueueName, message: Any) -> ConversationState:
        """This state with ``message`` (frozen) appended to ``queue``."""
        if queue == "steering":
            return attrs.evolve(self, steering=appended(self.steering, message))
        return attrs.evolve(self, follow_up=appended(self.follow_up, message))

    def without_first(self, queue: QueueName) -> ConversationState:
        """This state with the first message of ``queue`` taken off."""
        if queue == "steering":
            return attrs.evolve(self, steering=FrozenList(self.steering[1:]))
        return attrs.evolve(self, follow_up=FrozenList(self.follow_up[1:]))


def _make_regrown() -> Any:
    """``_regrown(state, messages, usage)``: ``state`` with the record's
    growing fields replaced, its other slots copied (straight-line code, no
    validator or converter to re-run: the values were read already)."""
    names = [field.name for field in attrs.fields(ConversationState)]
    lines = ["def _regrown(state, messages, usage):", "    new = new_object(cls)"]
    lines += [
        f"    set_slot(new, {name!r}, {name if name in ('messages', 'usage') else 'state.' + name})"
        for name in names
    ]
    lines.append("    return new")
    namespace: dict[str, Any] = {
        "new_object": object.__new__,
        "cls": ConversationState,
        "set_slot": object.__setattr__,
    }
    exec("\n".join(lines), namespace)  # code built from our own field names only
    return namespace["_regrown"]


_regrown: Final[Callable[[ConversationState, FrozenList, FrozenList], ConversationState]] = (
    _make_regrown()
)


def _small(state: ConversationState) -> tuple[Any, ...]:
    return (
        state.steering,
        state.follow_up,
        state.queue_status,
        state.turn_id,
        state.pending_interaction,
        state.resolved_interaction,
        state.catalog_revision,
        state.last_turn,
        state.resources,
        state.other,
    )


def initial_context(context: Mapping[str, Any] | None) -> dict[str, Any]:
    """A new run's context: the host's, and the empty conversation state."""
    return {**(context or {}), "conversation": ConversationState(catalog_revision=1).stored()}
