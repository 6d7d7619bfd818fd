"""``Rejected``: a quarantined tool's diagnostics, trusted-host data only.

Design (spec 000: rejected diagnostics "must not be serialized into model
requests, subscriber events, or checkpoints"): ``Rejected`` is deliberately
*not* a record.  It is a final, slotted, immutable plain class, so

* ``attrs.asdict``, ``dataclasses.asdict`` and cattrs' structural
  unstructuring do not apply to it (cattrs hands an unknown class back as
  is, and ``json.dumps`` then refuses it);
* it is not iterable and not a mapping, and ``json.dumps`` raises
  ``TypeError`` for it;
* ``pickle``, ``copy`` and ``copy.deepcopy`` raise ``TypeError``
  (``__reduce_ex__``/``__reduce__``/``__getstate__``), so it cannot be
  checkpointed by accident;
* ``repr``/``str``/``format`` show the tool name, revision and error class
  only, never the error's message or details (where a schema's content,
  such as an unsupported ``$schema`` URI, would appear).

A host reads the original :class:`~trio_backplane.errors.Error` through the
``error`` attribute, on purpose.
"""

from __future__ import annotations

from typing import Any, NoReturn, final

from ..errors import Error, ErrorClass

__all__ = ["Rejected"]


@final
class Rejected:
    """A tool quarantine omitted: ``name``, ``descriptor_revision``, original ``error``."""

    __slots__ = ("_descriptor_revision", "_error", "_name")

    _name: str
    _descriptor_revision: int
    _error: Error

    def __init__(self, name: str, descriptor_revision: int, error: Error) -> None:
        if type(name) is not str or type(descriptor_revision) is not int:
            raise Error(ErrorClass.VALIDATION, "Rejected needs a str name and an int revision")
        if not isinstance(error, Error):
            raise Error(ErrorClass.VALIDATION, "Rejected needs the original Error")
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_descriptor_revision", descriptor_revision)
        object.__setattr__(self, "_error", error)

    def __init_subclass__(cls, **kwargs: Any) -> NoReturn:
        raise TypeError("Rejected cannot be subclassed")

    @property
    def name(self) -> str:
        """The rejected tool's name."""
        return self._name

    @property
    def descriptor_revision(self) -> int:
        """The rejected descriptor's revision."""
        return self._descriptor_revision

    @property
    def error(self) -> Error:
        """The original structured error (trusted-host data: never forward it)."""
        return self._error

    @property
    def error_class(self) -> ErrorClass:
        """The class of the error: safe to show."""
        return self._error.error_class

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError("Rejected is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("Rejected is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Rejected):
            return NotImplemented
        return (self._name, self._descriptor_revision, self._error) == (
            other._name,
            other._descriptor_revision,
            other._error,
        )

    def __hash__(self) -> int:
        return hash((self._name, self._descriptor_revision, id(self._error)))

    def __repr__(self) -> str:
        return (
            f"Rejected(name={self._name!r}, descriptor_revision={self._descriptor_revision}, "
            f"error=<{self._error.error_class.value}: withheld>)"
        )

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        raise TypeError("Rejected diagnostics are trusted-host data and cannot be serialized")

    def __reduce__(self) -> NoReturn:
        raise TypeError("Rejected diagnostics are trusted-host data and cannot be serialized")

    def __getstate__(self) -> NoReturn:
        raise TypeError("Rejected diagnostics are trusted-host data and cannot be serialized")
