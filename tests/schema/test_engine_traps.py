"""One test per measured trap of jsonschema-rs (docs/notes/jsonschema-rs.md).

Each test fails if the trap reopens.  The raw engine's behaviour is asserted
too where that is cheap, so a fixed engine shows up as a test to revisit.
"""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest

from trio_backplane import Error, ErrorClass
from trio_backplane.schema import validate, validate_schema


def error_class(fn: Any, *args: Any, **kwargs: Any) -> ErrorClass:
    with pytest.raises(Error) as exc:
        fn(*args, **kwargs)
    return exc.value.error_class


def test_trap_01_retrieval_is_never_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trap 1 (SCH-20): unused branches and unreferenced $defs fetch nothing;
    every engine constructor runs with offline=True."""
    seen: list[dict[str, Any]] = []
    real = jsonschema_rs.Draft202012Validator

    def spy(schema: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return real(schema, **kwargs)

    monkeypatch.setattr(jsonschema_rs, "Draft202012Validator", spy)
    schema = {"$defs": {"unused": {"$ref": "#/$defs/ok"}, "ok": {}}, "properties": {"a": {}}}
    validate_schema(schema)
    assert seen
    assert all(k.get("offline") is True for k in seen)
    remote = {"$defs": {"unused": {"$ref": "http://127.0.0.1:9/never"}}}
    assert error_class(validate_schema, remote) is ErrorClass.VALIDATION


def test_trap_02_huge_integers() -> None:
    """Trap 2 (SCH-49): an int over 4 300 digits reads as 0 in the engine; we refuse it."""
    assert jsonschema_rs.validator_for({"maximum": 5}).is_valid(10**5000)  # the trap
    cls = error_class(validate, {"properties": {"n": {"maximum": 5}}}, {"n": 10**5000})
    assert cls is ErrorClass.EXECUTION_FAILURE
    cls = error_class(validate, {"properties": {"n": {"const": 0}}}, {"n": 10**5000})
    assert cls is ErrorClass.EXECUTION_FAILURE


@pytest.mark.parametrize("value", [float("inf"), -float("inf"), float("nan")])
def test_trap_03_non_finite_floats(value: float) -> None:
    """Trap 3 (SCH-11): inf and nan pass numeric bounds in the engine; we refuse them."""
    assert jsonschema_rs.validator_for({"maximum": 5, "minimum": 6}).is_valid(value)  # the trap
    schema = {"properties": {"x": {"maximum": 5, "multipleOf": 2}}}
    assert error_class(validate, schema, {"x": value}) is ErrorClass.VALIDATION


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"allOf": [{"$ref": "#"}]},
        {"$dynamicAnchor": "n", "$dynamicRef": "#n"},
    ],
)
def test_trap_04_non_progressing_cycles(schema: dict[str, Any]) -> None:
    """Trap 4 (SCH-50): such cycles accept everything in the engine; we refuse them."""
    assert error_class(validate_schema, schema) is ErrorClass.VALIDATION


def test_trap_05_deep_instances_cannot_reach_the_engine() -> None:
    """Trap 5 (SCH-32, SCH-35): a recursive schema and an instance 50 000 deep
    would segfault the engine; the input check refuses it first."""
    schema = {
        "properties": {"t": {"$ref": "#/$defs/t"}},
        "$defs": {"t": {"items": {"$ref": "#/$defs/t"}}},
    }
    value: list[Any] = []
    for _ in range(50_000):
        value = [value]
    assert error_class(validate, schema, {"t": value}) is ErrorClass.EXECUTION_FAILURE


def test_trap_06_deep_schemas() -> None:
    """Trap 6 (SCH-31, SCH-35): the engine raises ValueError beyond ~255 levels and
    its meta-validation segfaults at 20 000; limits refuse first, classed."""
    schema: dict[str, Any] = {}
    for _ in range(20_000):
        schema = {"not": schema}
    assert (
        error_class(validate_schema, {"properties": {"x": schema}}) is ErrorClass.EXECUTION_FAILURE
    )


def test_trap_07_unknown_keywords_policy() -> None:
    """Trap 7 (SCH-15): unknown keywords are annotations by our explicit policy."""
    validate({"properties": {"s": {"maxLenght": 1}}}, {"s": "long"})


def test_trap_08_vocabulary_from_registry() -> None:
    """Trap 8 (SCH-04): custom meta-schemas reach the engine through a Registry,
    where $vocabulary is honoured (a retriever would ignore it)."""
    meta = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.test/no-validation",
        "$vocabulary": {
            "https://json-schema.org/draft/2020-12/vocab/core": True,
            "https://json-schema.org/draft/2020-12/vocab/applicator": True,
        },
        "allOf": [
            {"$ref": "https://json-schema.org/draft/2020-12/meta/core"},
            {"$ref": "https://json-schema.org/draft/2020-12/meta/applicator"},
        ],
    }
    schema = {"$schema": "https://example.test/no-validation", "properties": {"n": {"maximum": 1}}}
    registry = {"https://example.test/no-validation": meta}
    # without the validation vocabulary, maximum is not an assertion
    validate(schema, {"n": 5}, schema_registry=registry)


def test_trap_09_unreferenced_bad_refs() -> None:
    """Trap 9 (SCH-21): {"$defs": {"x": {"$ref": "#/nope"}}} builds in the engine; we refuse it."""
    jsonschema_rs.validator_for({"$defs": {"x": {"$ref": "#/nope"}}})  # the trap: builds
    assert (
        error_class(validate_schema, {"$defs": {"x": {"$ref": "#/nope"}}}) is ErrorClass.VALIDATION
    )


class _Weird:
    pass


@pytest.mark.parametrize(
    "value", [{1, 2}, b"x", _Weird(), (1,), "\udc00", frozenset(), bytearray(b"x")]
)
def test_trap_10_non_json_values(value: Any) -> None:
    """Trap 10 (SCH-11): odd exceptions or silent acceptance become validation."""
    assert error_class(validate, {}, {"v": value}) is ErrorClass.VALIDATION
    assert error_class(validate, {}, {"v": [{"w": value}]}) is ErrorClass.VALIDATION


def test_trap_10_unexpected_engine_exception_is_classed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trap 10: any exception escaping the engine becomes execution_failure, never a pass."""
    from trio_backplane.schema import compile

    compiled = compile({"properties": {"boom": {"type": "string"}}})

    def explode(instance: Any) -> bool:
        raise RuntimeError("engine exploded")

    object.__setattr__(compiled, "_is_valid", explode)
    try:
        assert error_class(compiled.validate, {"boom": "x"}) is ErrorClass.EXECUTION_FAILURE
    finally:
        from trio_backplane.schema import cache_clear

        cache_clear()


def test_trap_11_error_details_never_carry_the_instance() -> None:
    """Trap 11 (SCH-23): details hold paths, keywords and bounded messages, never
    ``error.instance``: a huge secret value cannot ride along whole."""
    secret = "S" * 100_000
    with pytest.raises(Error) as exc:
        validate({"properties": {"token": {"maxLength": 8}}}, {"token": secret})
    (entry,) = exc.value.details["errors"]
    assert set(entry) == {"instance_path", "schema_path", "keyword", "message"}
    assert len(entry["message"]) <= 500
    assert secret not in repr(exc.value.to_dict())
