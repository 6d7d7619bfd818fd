"""A compiled schema: validation of arguments against it, and its refusals."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Final, Literal, final

import attrs
import jsonschema_rs

from ..errors import Error
from . import _instance
from ._content import clear_content_failure, take_content_failure
from ._errors import MAX_MESSAGE, cause, failure, invalid, limit_error, regex_failure
from ._instance import json_pointer
from ._options import Limits, SchemaOptions
from ._patterns import AsWritten

__all__ = ["MAX_ERROR_ENTRIES", "REGEX_BACKTRACK_LIMIT", "CompiledSchema", "Root"]

#: The fixed regex work limit: backtracking steps per match.
REGEX_BACKTRACK_LIMIT: Final = 100_000
#: At most this many error entries are reported per failure.
MAX_ERROR_ENTRIES: Final = 16

Root = Literal["tool", "any"]


def _raise_input(violation: _instance.Violation, limits: Limits, role: str) -> None:
    reason, path, detail = violation
    if reason == "input_too_deep":
        raise limit_error("input_too_deep", "max_input_depth", limits.max_input_depth, path=path)
    if reason == "input_too_large":
        raise limit_error("input_too_large", "max_input_bytes", limits.max_input_bytes, path=path)
    if reason == "integer_too_large":
        raise failure(
            "integer is too large to compare faithfully",
            reason="integer_too_large",
            maximum=_instance.INT_DIGITS_LIMIT,
            path=path,
        )
    raise invalid(f"{role} are not JSON data: {detail}", reason="not_json", path=path)


def _content_failure(noted: str | Error, written: AsWritten | None = None) -> Error:
    """What a content keyword noted beside the engine's verdict: a limit's
    ``Error`` as it is, a regex failure's message as the work limit."""
    if isinstance(noted, Error):
        return noted
    return _regex_work_limit(noted if written is None else written.message(noted))


def _regex_work_limit(message: str) -> Error:
    return failure(
        "pattern matching exceeded the regex work limit",
        reason="regex_work_limit",
        limit=REGEX_BACKTRACK_LIMIT,
        cause=message[:MAX_MESSAGE],
    )


@final
@attrs.frozen(eq=False)
class CompiledSchema:
    """A schema that passed preflight, built once for repeated validation.

    ``validate`` returns its argument itself, unchanged: no default
    is inserted, nothing is coerced, nothing is removed.  ``schema`` is the
    object first compiled under this fingerprint (equal as JSON to any later
    one); a tool descriptor keeps its own schema object.
    """

    schema: Any
    fingerprint: str
    options: SchemaOptions
    root: Root
    _is_valid: Callable[[Any], bool] = attrs.field(repr=False, alias="_is_valid")
    _iter_errors: Callable[[Any], Iterator[jsonschema_rs.ValidationError]] = attrs.field(
        repr=False, alias="_iter_errors"
    )
    _limits: Limits = attrs.field(repr=False, alias="_limits")
    #: the first error only (the engine stops there), for a recursive schema:
    #: collecting every error of one can grow exponentially with the nesting
    #: of the instance (each level re-entering several branches)
    _first_error: Callable[[Any], None] | None = attrs.field(
        default=None, repr=False, alias="_first_error"
    )
    #: a recursion multiplies evaluations per instance level (preflight's
    #: ``multiplies``): collecting even the first error can take exponential
    #: time, so a refusal reports the verdict alone and where it multiplies
    _multiplies: tuple[str, str, str] | None = attrs.field(
        default=None, repr=False, alias="_multiplies"
    )
    #: ``contentSchema`` is asserted: its regex failures arrive on the side
    #: (``_content``), since the engine's verdict may have hidden them
    _content: bool = attrs.field(default=False, repr=False, alias="_content")
    #: patterns the engine was given spelled out: an error names them as
    #: the schema writes them
    _written: AsWritten | None = attrs.field(default=None, repr=False, alias="_written")

    def validate(self, arguments: Any) -> Any:
        """Return ``arguments`` if they satisfy the schema; raise ``Error`` otherwise."""
        if self.root == "tool" and type(arguments) is not dict:
            raise invalid(
                "tool arguments must be a JSON object",
                reason="not_json",
                type=type(arguments).__name__,
            )
        limits = self._limits
        check = _instance.fast_check
        if check is None or check(arguments, limits.max_input_depth, limits.max_input_bytes):
            violation = _instance.check_python(
                arguments, limits.max_input_depth, limits.max_input_bytes
            )
            if violation is not None:
                _raise_input(violation, limits, self._role)
        try:
            if self._content:
                clear_content_failure()
            valid = self._is_valid(arguments)
        except Exception as exc:  # the engine must never fail open or escape unclassed
            raise failure(
                "schema validator failed", reason="engine_failure", cause=cause(exc)
            ) from exc
        if self._content:
            noted = take_content_failure()
            if noted is not None:
                raise _content_failure(noted)
        if valid:
            return arguments
        self._raise_mismatch(arguments)
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def _role(self) -> str:
        return "arguments" if self.root == "tool" else "structured content"

    def errors(self, instance: Any) -> list[dict[str, str]]:
        """Up to ``MAX_ERROR_ENTRIES`` error entries for ``instance`` (empty if valid)."""
        try:
            self.validate(instance)
        except Error as error:
            entries = error.details.get("errors")
            if entries is not None:
                return [dict(e) for e in entries]
            raise
        return []

    def _raise_mismatch(self, instance: Any) -> None:
        what = "tool arguments" if self.root == "tool" else "structured content"
        if self._multiplies is not None:
            if self._content:
                noted = take_content_failure()
                if noted is not None:
                    raise _content_failure(noted)
            where, step, reason = self._multiplies
            raise invalid(
                f"{what} do not match the schema",
                errors=[],
                error_count=0,
                errors_withheld={"reason": reason, "path": where, "step": step},
            )
        try:
            if self._first_error is None:
                collected = list(self._iter_errors(instance))
            else:
                collected = _first_of(self._first_error, instance)
        except Exception as exc:
            raise failure(
                "schema validator failed", reason="engine_failure", cause=cause(exc)
            ) from exc
        noted = regex_failure(collected)
        if noted is None and self._content:
            noted = take_content_failure()
        written = self._written
        if noted is not None:
            raise _content_failure(noted, written)
        entries = [
            {
                "instance_path": json_pointer(e.instance_path),
                "schema_path": json_pointer(e.schema_path),
                "keyword": e.kind.name,
                "message": e.message[:MAX_MESSAGE],
            }
            if written is None
            else written.entry(e)
            for e in collected[:MAX_ERROR_ENTRIES]
        ]
        details: dict[str, Any] = {"errors": entries, "error_count": len(collected)}
        if self._first_error is not None:
            details["first_error_only"] = True  # a recursive schema: see _first_error
        raise invalid(f"{what} do not match the schema", **details)


def _first_of(
    validate: Callable[[Any], None], instance: Any
) -> list[jsonschema_rs.ValidationError]:
    """The engine's first error for an instance it found invalid."""
    try:
        validate(instance)
    except jsonschema_rs.ValidationError as error:
        return [error]
    raise AssertionError("the engine judged the instance both invalid and valid")
