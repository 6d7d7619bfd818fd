"""What the transition and its handlers share: the errors they raise and
the reading of a run's outstanding work."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import Error, ErrorClass
from ._commands import UNSET, KernelCommand
from ._frozen import freeze
from ._records import RunRecord

__all__ = ["cleanup_requirements"]


def _invalid(record: RunRecord, command: KernelCommand) -> Error:
    return Error(
        ErrorClass.VALIDATION,
        "command is invalid in the current run state",
        {"state": record.state, "command": command.kind},
    )


def _get(value: Any, default: Any = None) -> Any:
    """A field's value, ``default`` when it was not given."""
    return default if value is UNSET else value


def _conflict(message: str, **details: Any) -> Error:
    return Error(ErrorClass.RESOURCE_CONFLICT, message, details)


def _require_state(record: RunRecord, command: KernelCommand, *states: str) -> None:
    if record.state not in states:
        raise _invalid(record, command)


def _unsettled(record: RunRecord) -> dict[str, list[str]]:
    return {
        "provider": []
        if record.active_provider is None
        else [record.active_provider["attempt_id"]],
        "tools": sorted(record.active_tools),
        "children": sorted(k for k, c in record.children.items() if not c.get("settled")),
        "dependencies": sorted(set(record.dependencies)),
    }


def _require_settled(record: RunRecord) -> None:
    unsettled = _unsettled(record)
    if any(unsettled.values()) or record.active_wait is not None:
        raise _conflict("required work remains unsettled", unsettled=unsettled)


def cleanup_requirements(record: RunRecord) -> Mapping[str, Any]:
    """The outstanding work a confirmed cleanup must settle, exactly:
    ``{"provider", "tools", "children", "dependencies"}`` (sorted id lists)."""
    try:
        unsettled = _unsettled(record)
    except (KeyError, TypeError, AttributeError) as exc:
        raise _malformed(exc) from None
    return freeze(unsettled)  # type: ignore[no-any-return]


def _malformed(exc: BaseException) -> Error:
    return Error(
        ErrorClass.VALIDATION,
        "record is malformed: the kernel cannot read its active work",
        {"cause": f"{type(exc).__name__}: {exc}"[:300]},
    )
