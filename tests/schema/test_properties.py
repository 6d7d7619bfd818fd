"""Property-based tests of the schema boundary (hypothesis).

* arbitrary Python values as arguments and arbitrary JSON-ish values as
  schemas: only a classed ``Error`` ever escapes (SCH-11, SCH-35, SCH-49, ...);
* valid JSON arguments come back as the very object, unchanged (SCH-09);
* fingerprints ignore key order and keep ``true`` apart from ``1`` (SCH-46);
* a differential test against python ``jsonschema`` 4.26 on instances
  generated from the real fixture schemas (SCH-43..SCH-45);
* a metamorphic test on the official JSON-Schema-Test-Suite: rewrites that
  cannot change a verdict do not change ours (SCH-42).

The number of examples comes from the hypothesis profile of
``tests/conftest.py`` ("dev" by default, "ci" when ``CI`` is set).
"""

from __future__ import annotations

import copy
import enum
import functools
import importlib
import json
import math
import os
import random
import re
import sys
import urllib.parse
from collections import OrderedDict, UserDict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import jsonschema
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from tests.conftest import FIXTURES, WORKLOADS
from trio_backplane.errors import Error, ErrorClass
from trio_backplane.schema import (
    cache_clear,
    compile,
    compile_output,
    validate,
    validate_output,
    validate_schema,
)

Strategy = st.SearchStrategy[Any]

#: Host preset ``max_input_depth`` (SCH-32) and the engine's integer bound (SCH-49).
MAX_INPUT_DEPTH: Final = 128
HUGE: Final = 10**4300  # the smallest integer with 4 301 digits

#: The classes a schema refusal may have: validation for a schema that is not
#: a valid (or not a JSON) Draft 2020-12 schema (SCH-06, SCH-16, SCH-21,
#: SCH-22, SCH-27, SCH-50), unsupported_capability for a dialect or root the
#: boundary does not support (SCH-02, SCH-07), execution_failure for a
#: ``Limits`` refusal or the regex work limit (SCH-28, SCH-29, SCH-31..SCH-35).
SCHEMA_ERROR_CLASSES: Final = frozenset(
    {ErrorClass.VALIDATION, ErrorClass.UNSUPPORTED_CAPABILITY, ErrorClass.EXECUTION_FAILURE}
)


# ---------------------------------------------------------------------------
# Generic strategies

json_leaves: Strategy = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)

json_values: Strategy = st.recursive(
    json_leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=6), children, max_size=4),
    ),
    max_leaves=12,
)

small_json: Strategy = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 3),
        st.sampled_from([0.5, -0.0, 1.0, 1e300]),
        st.text(max_size=4),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(max_size=3), children, max_size=3),
    ),
    max_leaves=5,
)


class _SubDict(dict[str, Any]):
    pass


class _SubList(list[Any]):
    pass


class _SubStr(str):
    __slots__ = ()


class _Color(enum.IntEnum):
    RED = 1


class _Opaque:
    def __repr__(self) -> str:
        return "_Opaque()"


def _lone_surrogate(parts: tuple[str, str, str]) -> str:
    return parts[0] + parts[1] + parts[2]


lone_surrogates: Strategy = st.tuples(
    st.text(max_size=3),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    st.text(max_size=3),
).map(_lone_surrogate)

non_json_leaves: Strategy = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]),
    # by index: repr() of an integer over 4 300 digits raises, so it must not
    # appear in a strategy's repr
    st.integers(0, 3).map(lambda i: (HUGE, -HUGE, 10**5000, HUGE + 7)[i]),
    st.binary(max_size=4),
    lone_surrogates,
    st.builds(_Opaque),
    st.sampled_from([_Color.RED, _SubStr("s"), complex(1, 2), frozenset({1})]),
    st.sets(st.integers(0, 3), max_size=3),
)


def _nest(value: Any, depth: int, as_dict: bool) -> Any:
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


def _cyclic(kind: str) -> Any:
    if kind == "dict":
        loop: dict[str, Any] = {"a": 1}
        loop["self"] = loop
        return loop
    items: list[Any] = [1]
    items.append(items)
    return {"list": items}


def _python_containers(children: Strategy) -> Strategy:
    hashable = st.one_of(
        st.integers(-3, 3), st.none(), st.booleans(), st.tuples(st.integers(0, 2)), st.just(1.5)
    )
    return st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(max_size=4), children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(hashable, children, min_size=1, max_size=2),  # non-str keys
        st.dictionaries(st.text(max_size=4), children, max_size=2).map(_SubDict),
        st.dictionaries(st.text(max_size=4), children, max_size=2).map(OrderedDict),
        st.dictionaries(st.text(max_size=4), children, max_size=2).map(UserDict),
        st.lists(children, max_size=2).map(_SubList),
        st.dictionaries(lone_surrogates, children, min_size=1, max_size=1),
    )


python_values: Strategy = st.one_of(
    st.recursive(
        st.one_of(json_leaves, non_json_leaves),
        _python_containers,
        max_leaves=10,
    ),
    st.builds(
        _nest,
        st.one_of(json_leaves, non_json_leaves, st.just({})),
        st.integers(min_value=100, max_value=200),
        st.booleans(),
    ),
    st.builds(_cyclic, st.sampled_from(["dict", "list"])),
)


def _violations(value: Any) -> set[str]:
    """Every way ``value`` leaves the JSON data model under the host limits.

    An independent model of the boundary's JSON data check: ``"not_json"``
    (SCH-11), ``"huge"`` (SCH-49) and ``"deep"`` (SCH-32; a cycle is infinitely
    deep).  Only exact ``dict``/``list`` are descended into, as the first
    violation on a path hides what lies below it.
    """
    found: set[str] = set()
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)
        if kind is dict or kind is list:
            if depth > MAX_INPUT_DEPTH:
                found.add("deep")
                continue
            if kind is dict:
                for key, child in node.items():
                    if type(key) is not str or _has_surrogate(key):
                        found.add("not_json")
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in node)
        elif kind is str:
            if _has_surrogate(node):
                found.add("not_json")
        elif kind is int:
            if abs(node) >= HUGE:
                found.add("huge")
        elif kind is float:
            if not math.isfinite(node):
                found.add("not_json")
        elif node is not None and kind is not bool:
            found.add("not_json")
    return found


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


_VIOLATION_CLASS: Final = {
    "not_json": ErrorClass.VALIDATION,
    "huge": ErrorClass.EXECUTION_FAILURE,
    "deep": ErrorClass.EXECUTION_FAILURE,
}


def _expected(value: Any, *, tool: bool) -> tuple[set[ErrorClass], bool]:
    """(the classes an ``Error`` may have, whether returning is allowed)."""
    if tool and type(value) is not dict:
        return {ErrorClass.VALIDATION}, False
    found = _violations(value)
    if not found:
        return {ErrorClass.VALIDATION}, True  # a plain mismatch, or a pass
    return {_VIOLATION_CLASS[v] for v in found}, False


# ---------------------------------------------------------------------------
# (a) arbitrary Python values as arguments

RECURSIVE_SCHEMA: Final = {
    "$defs": {"t": {"items": {"$ref": "#/$defs/t"}}},
    "properties": {"a": {"$ref": "#/$defs/t"}},
}

ARGUMENT_SCHEMAS: Final[list[Any]] = [
    {},
    {"type": "object"},
    RECURSIVE_SCHEMA,
    {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "maximum": 5},
            "b": {"type": "array", "items": {"type": "number", "minimum": 0}},
            "c": {"type": "string", "pattern": "^x+$", "maxLength": 5},
        },
        "required": ["a"],
    },
    {"additionalProperties": {"type": ["string", "number", "boolean", "null"]}},
    {
        "properties": {"u": {"uniqueItems": True}, "k": {"const": {"a": [1, True]}}},
        "propertyNames": {"maxLength": 3},
        "unevaluatedProperties": {"not": {"type": "array"}},
    },
]


def _call(fn: Callable[[], Any]) -> tuple[Any, Error | None]:
    try:
        return fn(), None
    except Error as error:
        return None, error


def _check_arguments(schema: Any, value: Any, *, tool: bool) -> None:
    classes, may_return = _expected(value, tool=tool)
    if tool:
        result, error = _call(lambda: validate(schema, value))
    else:
        result, error = _call(lambda: validate_output(schema, value))
    if error is None:
        assert may_return, f"returned for a value outside the JSON data model: {value!r}"
        assert result is value
    else:
        assert error.error_class in classes, (error, classes)


@given(schema=st.sampled_from(ARGUMENT_SCHEMAS), value=python_values)
def test_arbitrary_python_arguments_only_raise_error(schema: Any, value: Any) -> None:
    """SCH-09, SCH-11, SCH-32, SCH-35, SCH-47, SCH-49: any Python value given to
    ``validate`` (tool root) or ``validate_output`` (any root) is returned
    itself or refused with ``Error``, never another exception; a value
    outside the JSON data model is always refused, with ``validation`` for a
    wrong type/key/float/surrogate and ``execution_failure`` for an integer
    over 4 300 digits or a nesting (or cycle) over 128 levels."""
    _check_arguments(schema, value, tool=True)
    _check_arguments(schema, {"a": value}, tool=True)
    _check_arguments(schema, value, tool=False)


# ---------------------------------------------------------------------------
# (a) arbitrary JSON-ish values as schemas

D2020: Final = "https://json-schema.org/draft/2020-12/schema"
TYPES: Final = ["null", "boolean", "object", "array", "number", "string", "integer"]
NAMES: Final = ["a", "b", "x", "y", "a/b", "~0", ""]

REF_STRINGS: Final = [
    "#",
    "#/$defs/x",
    "#/$defs/y",
    "#/$defs/missing",
    "#/properties/a",
    "#/$defs/a~1b",
    "#/%24defs/x",
    "#x",
    "#bad anchor",
    "http://x",
    "https://x.test/s.json",
    "https://x.test/s.json#/$defs/x",
    "other.json",
    "file:other.json",
    "urn:example:x",
    D2020,
    "https://json-schema.org/draft/2020-12/meta/core",
    "",
]

REGEX_TOKENS: Final = [
    "a",
    "b",
    ".",
    "^",
    "$",
    r"\d",
    r"\w",
    r"\s",
    r"\b",
    "[a-z]",
    "[^a]",
    "[",
    "]",
    "(",
    ")",
    "(a+)+",
    "(a|a)*",
    "*",
    "+",
    "?",
    "{2}",
    "{1,3}",
    "|",
    "\\",
    "(?=a)",
    "(?!b)",
    "(?<=a)",
    r"\1",
    r"\p{L}",
    "(?P<n>a)",
    r"\k<n>",
    "(?<n>a)",
    "[^]",
    "(?i)",
    r"\u0041",
    r"\Z",
]

patterns: Strategy = st.lists(st.sampled_from(REGEX_TOKENS), max_size=6).map("".join)

KEYWORDS: Final = [
    "type",
    "properties",
    "patternProperties",
    "additionalProperties",
    "items",
    "prefixItems",
    "contains",
    "minContains",
    "maxContains",
    "required",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "propertyNames",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$ref",
    "$dynamicRef",
    "$defs",
    "$id",
    "$anchor",
    "$dynamicAnchor",
    "$schema",
    "$comment",
    "$vocabulary",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
    "default",
    "examples",
    "title",
    "x-mcp-header",
]

numbers: Strategy = st.one_of(
    st.integers(-10, 10),
    st.floats(-10, 10, allow_nan=False),
    st.sampled_from([0.01, 1e308, -1e308, 2**64, 5e-324, 0]),
)
counts: Strategy = st.one_of(st.integers(0, 4), st.sampled_from([-1, 1.0, 1.5, 2**64]))


def _keyword_values(children: Strategy) -> dict[str, Strategy]:
    """A well-typed strategy per keyword (each mixed with junk by the caller)."""
    schema_map = st.dictionaries(st.sampled_from(NAMES), children, max_size=3)
    schema_list = st.lists(children, max_size=3)
    name_list = st.lists(st.sampled_from(NAMES), max_size=3)
    types = st.one_of(
        st.sampled_from([*TYPES, "bogus"]), st.lists(st.sampled_from([*TYPES, "bogus"]), max_size=3)
    )
    return {
        "type": types,
        "properties": schema_map,
        "patternProperties": st.dictionaries(patterns, children, max_size=2),
        "additionalProperties": children,
        "items": children,
        "prefixItems": schema_list,
        "contains": children,
        "minContains": counts,
        "maxContains": counts,
        "required": name_list,
        "enum": st.lists(small_json, max_size=3),
        "const": small_json,
        "minimum": numbers,
        "maximum": numbers,
        "exclusiveMinimum": numbers,
        "exclusiveMaximum": numbers,
        "multipleOf": numbers,
        "minLength": counts,
        "maxLength": counts,
        "pattern": patterns,
        "format": st.sampled_from(["email", "date-time", "uri", "regex", "bogus"]),
        "minItems": counts,
        "maxItems": counts,
        "uniqueItems": st.booleans(),
        "minProperties": counts,
        "maxProperties": counts,
        "dependentRequired": st.dictionaries(st.sampled_from(NAMES), name_list, max_size=2),
        "dependentSchemas": schema_map,
        "propertyNames": children,
        "allOf": schema_list,
        "anyOf": schema_list,
        "oneOf": schema_list,
        "not": children,
        "if": children,
        "then": children,
        "else": children,
        "unevaluatedProperties": children,
        "unevaluatedItems": children,
        "$ref": st.sampled_from(REF_STRINGS),
        "$dynamicRef": st.sampled_from(REF_STRINGS),
        "$defs": schema_map,
        "$id": st.sampled_from(
            ["http://x", "https://x.test/s.json", "#frag", "rel.json", "urn:uuid:1", ""]
        ),
        "$anchor": st.sampled_from(["x", "y", "1bad", ""]),
        "$dynamicAnchor": st.sampled_from(["x", "meta"]),
        "$schema": st.sampled_from(
            [D2020, D2020 + "#", "http://json-schema.org/draft-07/schema#", "https://x.test/m"]
        ),
        "$comment": st.text(max_size=5),
        "$vocabulary": st.dictionaries(
            st.sampled_from([D2020, "https://x.test/vocab"]), st.booleans(), max_size=2
        ),
        "contentEncoding": st.sampled_from(["base64", "bogus"]),
        "contentMediaType": st.sampled_from(["application/json", "text/plain"]),
        "contentSchema": children,
        "default": small_json,
        "examples": st.lists(small_json, max_size=2),
        "title": st.text(max_size=5),
        "x-mcp-header": st.text(max_size=5),
    }


def _mostly(good: Strategy, bad: Strategy) -> Strategy:
    """``good`` four times in five, else ``bad``."""
    return st.integers(0, 4).flatmap(lambda i: bad if i == 0 else good)


def _schema_objects(children: Strategy) -> Strategy:
    values = _keyword_values(children)
    junk = st.one_of(small_json, st.sampled_from(REF_STRINGS), patterns)

    def build(keys: list[str]) -> Strategy:
        return st.fixed_dictionaries({k: _mostly(values[k], junk) for k in keys})

    return st.lists(st.sampled_from(KEYWORDS), unique=True, max_size=4).flatmap(build)


schema_like: Strategy = st.recursive(
    st.one_of(st.booleans(), st.just({}), st.sampled_from([{"type": t} for t in TYPES])),
    _schema_objects,
    max_leaves=8,
)


def _with_defs(root: Any, defs: dict[str, Any]) -> Any:
    return {**root, "$defs": defs} if isinstance(root, dict) else {"$defs": defs, "not": root}


#: Roots whose ``$defs`` hold the names REF_STRINGS point at, so that
#: references resolve (and cycle) more often.
schemas_with_defs: Strategy = st.builds(
    _with_defs,
    schema_like,
    st.fixed_dictionaries({}, optional={"x": schema_like, "y": schema_like, "a/b": schema_like}),
)

#: Schemas that are not even JSON: the boundary must refuse them with a class.
odd_schemas: Strategy = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=3),
    st.lists(small_json, max_size=2),
    st.fixed_dictionaries({"properties": st.fixed_dictionaries({"a": non_json_leaves})}),
    st.fixed_dictionaries({"const": non_json_leaves}),
    st.dictionaries(st.integers(0, 3), small_json, min_size=1, max_size=2),
    st.builds(_cyclic, st.just("dict")),
    st.builds(_nest, st.just({}), st.integers(120, 200), st.just(True)),
)

output_instances: Strategy = st.one_of(
    small_json,
    st.text(alphabet="ab\n", max_size=40),
    st.just("a" * 40 + "b"),
)


@given(
    schema=_mostly(st.one_of(schema_like, schemas_with_defs), odd_schemas),
    instance=output_instances,
)
def test_arbitrary_schemas_only_raise_classed_errors(schema: Any, instance: Any) -> None:
    """SCH-06, SCH-16, SCH-21, SCH-22, SCH-27, SCH-29, SCH-31, SCH-35, SCH-50:
    any schema-like value (random keywords with random or well-typed values,
    ``$ref`` strings, regexes from a small ECMA/Python alphabet, non-JSON
    leaves, cycles, deep nesting) given to ``validate_schema`` or
    ``validate_output`` only ever raises ``Error``, of class ``validation``,
    ``unsupported_capability`` or ``execution_failure``; a schema outside
    the JSON data model is always refused."""
    not_json = bool(_violations(schema))
    refusal = _call(lambda: validate_schema(schema))[1]
    result, error = _call(lambda: validate_output(schema, instance))
    for outcome in (refusal, error):
        if outcome is None:
            assert not not_json, f"a schema outside the JSON data model passed: {schema!r}"
        else:
            assert outcome.error_class in SCHEMA_ERROR_CLASSES, outcome
    assert error is not None or result is instance


def _disguise(value: Any) -> Any:
    """``value`` with every list turned into a tuple and every ``1`` into an
    ``IntEnum``: the same JSON text for ``json.dumps``, but not JSON data."""
    if type(value) is dict:
        return {k: _disguise(v) for k, v in value.items()}
    if type(value) is list:
        return tuple(_disguise(v) for v in value)
    if type(value) is int and value == _Color.RED:
        return _Color.RED
    return value


@given(schema=st.one_of(schema_like, st.just({"const": 1})).map(lambda s: {"allOf": [s]}))
def test_non_json_schema_never_shares_a_cache_entry(schema: dict[str, Any]) -> None:
    """SCH-46, SCH-11: a schema outside the JSON data model (a tuple where a
    list belongs, an ``IntEnum`` for ``1``) is refused whatever the cache
    holds, and refusing it never changes the outcome for the JSON schema it
    imitates (a cached refusal must not be replayed for an equal-looking
    valid schema).  Regression: ``validate_schema({"const": IntEnum(1)})``
    once cached its refusal under the key of ``{"const": 1}``, which was then
    refused too (found by test_arbitrary_schemas_only_raise_classed_errors)."""
    disguised = _disguise(schema)
    assert _violations(disguised) == {"not_json"}
    try:
        cache_clear()
        fresh = _call(lambda: compile_output(schema))[1]
        cache_clear()
        with pytest.raises(Error) as exc:  # the refusal goes into the cache first
            compile_output(disguised)
        assert exc.value.error_class is ErrorClass.VALIDATION
        after = _call(lambda: compile_output(schema))[1]
        assert (after is None) == (fresh is None), (
            f"{schema!r} gave {after!r} after {disguised!r} was refused"
        )
        cache_clear()
        _call(lambda: compile_output(schema))  # the JSON schema goes into the cache first
        assert _call(lambda: compile_output(disguised))[1] is not None, (
            f"{disguised!r} passed because {schema!r} was cached"
        )
    finally:
        cache_clear()


# ---------------------------------------------------------------------------
# (b) valid JSON arguments come back unchanged

SCH09_SCHEMAS: Final[list[Any]] = [
    *ARGUMENT_SCHEMAS,
    {
        "properties": {
            "a": {"type": "integer", "default": 3},
            "b": {"default": {"x": [1]}, "type": "object"},
        },
        "additionalProperties": {"default": None},
    },
    {"properties": {"n": {"type": "integer", "default": 5}}, "unevaluatedProperties": True},
]


def _typed(value: Any) -> Any:
    """``value`` as nested tuples that keep types and key order (``1 != True``)."""
    if type(value) is dict:
        return ("dict", tuple((k, _typed(v)) for k, v in value.items()))
    if type(value) is list:
        return ("list", tuple(_typed(v) for v in value))
    if type(value) is float:
        return ("float", repr(value))
    return (type(value).__name__, value)


json_arguments: Strategy = st.one_of(
    st.dictionaries(st.text(max_size=6), json_values, max_size=5),
    st.fixed_dictionaries(
        {"a": json_values, "n": st.one_of(st.integers(), st.just(10**4300 - 1))},
        optional={"b": json_values, "u": st.lists(small_json, max_size=4)},
    ),
    st.builds(lambda v, d: {"a": _nest(v, d, False)}, json_leaves, st.integers(0, 126)),
)


@given(schema=st.sampled_from(SCH09_SCHEMAS), arguments=json_arguments)
def test_valid_json_arguments_come_back_unchanged(schema: Any, arguments: Any) -> None:
    """SCH-09, SCH-10: for JSON arguments ``validate`` returns the very object
    (or raises ``validation`` for a mismatch), and it stays deep-equal, types
    and key order included, to a deep copy taken before the call."""
    before = copy.deepcopy(arguments)
    result, error = _call(lambda: validate(schema, arguments))
    if error is None:
        assert result is arguments
    else:
        assert error.error_class is ErrorClass.VALIDATION, error
    assert _typed(arguments) == _typed(before)
    result, error = _call(lambda: compile(schema).validate(arguments))
    assert error is not None or result is arguments
    assert _typed(arguments) == _typed(before)


# ---------------------------------------------------------------------------
# (c) fingerprints


def _sane_keyword_values(children: Strategy) -> dict[str, Strategy]:
    schema_map = st.dictionaries(st.text(max_size=4), children, max_size=3)
    schema_list = st.lists(children, min_size=1, max_size=3)
    names = st.lists(st.text(max_size=4), unique=True, max_size=3)
    bound = st.one_of(st.integers(-5, 5), st.floats(-5, 5, allow_nan=False))
    return {
        "type": st.one_of(st.sampled_from(TYPES), st.lists(st.sampled_from(TYPES), unique=True)),
        "properties": schema_map,
        "patternProperties": st.dictionaries(
            st.sampled_from(["^a", "b+", "^[a-z]*$", "x|y", ""]), children, max_size=2
        ),
        "additionalProperties": children,
        "items": children,
        "prefixItems": schema_list,
        "contains": children,
        "required": names,
        "enum": st.lists(json_values, min_size=1, max_size=3),
        "const": json_values,
        "minimum": bound,
        "maximum": bound,
        "multipleOf": st.sampled_from([1, 2, 0.5, 0.01]),
        "minLength": st.integers(0, 4),
        "maxItems": st.integers(0, 4),
        "uniqueItems": st.booleans(),
        "dependentRequired": st.dictionaries(st.text(max_size=3), names, max_size=2),
        "propertyNames": children,
        "allOf": schema_list,
        "anyOf": schema_list,
        "oneOf": schema_list,
        "not": children,
        "if": children,
        "then": children,
        "unevaluatedProperties": children,
        "default": json_values,
        "description": st.text(max_size=8),
        "x-mcp-header": st.text(max_size=4),
    }


def _sane_objects(children: Strategy) -> Strategy:
    values = _sane_keyword_values(children)

    def build(keys: list[str]) -> Strategy:
        return st.fixed_dictionaries({k: values[k] for k in keys})

    return st.lists(st.sampled_from(sorted(values)), unique=True, max_size=5).flatmap(build)


sane_schemas: Strategy = st.recursive(
    st.one_of(st.booleans(), st.just({}), st.sampled_from([{"type": t} for t in TYPES])),
    _sane_objects,
    max_leaves=10,
)


def _tool_root(schema: Any) -> dict[str, Any]:
    root = dict(schema) if isinstance(schema, dict) else {"not": {"const": schema}}
    root.pop("type", None)
    return root


def _reorder(value: Any, rng: random.Random) -> Any:
    """``value`` with the keys of every object (at every level) shuffled."""
    if type(value) is dict:
        keys = list(value)
        rng.shuffle(keys)
        return {k: _reorder(value[k], rng) for k in keys}
    if type(value) is list:
        return [_reorder(v, rng) for v in value]
    return value


def _reverse(value: Any) -> Any:
    if type(value) is dict:
        return {k: _reverse(value[k]) for k in reversed(list(value))}
    if type(value) is list:
        return [_reverse(v) for v in value]
    return value


def _compiled(build: Callable[[Any], Any], schema: Any) -> tuple[Any, Error | None]:
    try:
        return build(schema), None
    except Error as error:
        return None, error


@given(
    schema=sane_schemas.map(_tool_root),
    rng=st.randoms(use_true_random=False),
)
def test_fingerprint_ignores_key_order(schema: dict[str, Any], rng: random.Random) -> None:
    """SCH-46: a schema rebuilt with its keys reversed or shuffled at every
    level (inside ``const``/``enum`` values too) has the same fingerprint and
    hits the same cache entry, for ``compile`` and ``compile_output``; a
    refusal is refused again."""
    for variant in (_reverse(schema), _reorder(schema, rng)):
        assert variant == schema
        for build in (compile, compile_output):
            first, error = _compiled(build, schema)
            again, error_again = _compiled(build, variant)
            if error is not None:
                assert error_again is not None, "refusal depends on key order"
                continue
            assert error_again is None, f"key order changed the outcome: {error_again}"
            note(f"fingerprint {first.fingerprint}")
            assert again.fingerprint == first.fingerprint
            assert again is first  # one cache entry


def _bools_to_ints(value: Any) -> Any:
    if type(value) is bool:
        return int(value)
    if type(value) is dict:
        return {k: _bools_to_ints(v) for k, v in value.items()}
    if type(value) is list:
        return [_bools_to_ints(v) for v in value]
    return value


with_a_bool: Strategy = st.one_of(
    st.booleans(),
    st.tuples(json_values, st.booleans()).map(list),
    # the key holding the bool is never "z", which the second entry would overwrite
    st.tuples(st.text(max_size=3).filter(lambda k: k != "z"), st.booleans(), json_values).map(
        lambda t: {t[0]: t[1], "z": t[2]}
    ),
)


@given(value=with_a_bool)
def test_fingerprint_keeps_bools_apart_from_numbers(value: Any) -> None:
    """SCH-46, SCH-12: ``{"const": true}`` and ``{"const": 1}`` (and any value
    with its booleans turned into 0/1) have different fingerprints, and the
    two constants do not accept each other's value."""
    assert compile({"const": True}).fingerprint != compile({"const": 1}).fingerprint
    swapped = _bools_to_ints(value)
    for build in (compile_output, compile):
        schema: dict[str, Any] = {"properties": {"c": {"const": value}}}
        other: dict[str, Any] = {"properties": {"c": {"const": swapped}}}
        assert build(schema).fingerprint != build(other).fingerprint
    with pytest.raises(Error) as exc:
        validate_output({"const": value}, swapped)
    assert exc.value.error_class is ErrorClass.VALIDATION
    assert validate_output({"const": value}, value) is value


# ---------------------------------------------------------------------------
# (d) differential test against python jsonschema on the fixture schemas


def _fixture_schemas() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in (
        "sigma_builtin_tool_schemas.json",
        "mcp_github_server_tools.json",
        "issue_46_tool_schemas.json",
        "issue_46_live_catalog.json",
    ):
        stem = name.removesuffix(".json")
        for record in json.loads((FIXTURES / name).read_text(encoding="utf-8")):
            out[f"{stem}::{record['name']}"] = record["inputSchema"]
    bench = json.loads((WORKLOADS / "schemas.json").read_text(encoding="utf-8"))
    for key in ("tool", "big_defs"):
        out[f"bench::{key}"] = bench[key]["schema"]
    return out


FIXTURE_SCHEMAS: Final = _fixture_schemas()

#: Disagreements with python ``jsonschema`` found by the differential test,
#: by (schema id, kind), with the reason.  A disagreement is excused only when
#: it is of a listed kind *for that schema* (see :func:`_disagreement_kind`):
#: anything else fails the test.  :data:`DISAGREEMENT_EXAMPLES` holds one
#: reproducer per entry, checked by ``test_known_disagreements_reproduce``.
#:
#: "pattern-dollar": python ``jsonschema`` runs ``pattern`` with Python's
#: ``re.search``, where ``$`` also matches just before a final ``"\n"``, so it
#: accepts e.g. ``"a/b\n"`` for ``^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$``.  Draft
#: 2020-12 says patterns are ECMA-262 regular expressions (core section 6.4,
#: validation section 6.3.3), and an ECMA-262 ``$`` without the multiline flag
#: matches only at the end of the input (SCH-25): trio_backplane is right to
#: refuse, python ``jsonschema`` is wrong.  Recognised when the instance holds
#: a string ending in ``"\n"`` and python ``jsonschema`` with an ECMA-faithful
#: ``pattern`` (``$`` = end of input) gives our verdict.
KNOWN_DISAGREEMENTS: Final[dict[tuple[str, str], str]] = {
    ("bench::tool", "pattern-dollar"): "properties repo and branch: patterns end in $",
    ("bench::big_defs", "pattern-dollar"): "$defs/id: pattern ends in $",
    ("issue_46_tool_schemas::constrained", "pattern-dollar"): "property code: ^(none|[A-Z])$",
}

DISAGREEMENT_EXAMPLES: Final[list[tuple[str, str, Any]]] = [
    ("bench::tool", "pattern-dollar", {"query": "q", "repo": "a/b\n"}),
    ("bench::tool", "pattern-dollar", {"query": "q", "repo": "a/b", "branch": "main\n"}),
    (
        "bench::big_defs",
        "pattern-dollar",
        {"section0": [{"id": "deadbeef-0000\n", "name": "n"}]},
    ),
    (
        "issue_46_tool_schemas::constrained",
        "pattern-dollar",
        {"count": 1, "code": "none\n", "tags": ["x"], "vars": {}, "attachment": {}},
    ),
]


def _ecma_to_python(pattern: str) -> str:
    """A Python ``re`` pattern with ECMA-262 meaning for the syntax the fixture
    patterns use: ``$`` is the end of input, ``.`` excludes every ECMA line
    terminator, ``\\d``/``\\w`` are ASCII."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            pair = pattern[i : i + 2]
            ascii_class = {"\\d": "0-9", "\\w": "A-Za-z0-9_"}.get(pair)
            if ascii_class is None:
                out.append(pair)
            else:
                out.append(ascii_class if in_class else f"[{ascii_class}]")
            i += 2
            continue
        if in_class:
            in_class = c != "]"
            out.append(c)
        elif c == "[":
            in_class = True
            out.append(c)
        elif c == "$":
            out.append(r"(?![\s\S])")
        elif c == ".":
            out.append("[^\n\r\u2028\u2029]")
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    del schema
    if validator.is_type(instance, "string") and not re.search(_ecma_to_python(pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


EcmaValidator: Final = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, validators={"pattern": _ecma_pattern}
)


@functools.cache
def _python_validators(name: str) -> tuple[Any, Any]:
    schema = FIXTURE_SCHEMAS[name]
    return jsonschema.Draft202012Validator(schema), EcmaValidator(schema)


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _disagreement_kind(name: str, instance: Any, ours: bool) -> str | None:
    """The kind of a disagreement (see :data:`KNOWN_DISAGREEMENTS`), or None."""
    _plain, ecma = _python_validators(name)
    if any(s.endswith("\n") for s in _strings(instance)) and ecma.is_valid(instance) == ours:
        return "pattern-dollar"
    return None


def _resolve(root: Any, ref: str) -> Any:
    assert ref.startswith("#/"), ref  # the fixtures only use local JSON pointers
    node = root
    for part in ref[2:].split("/"):
        node = node[urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")]
    return node


class _Guided:
    """Strategies for instances shaped by a schema: its own property names
    and values of its types.

    ``clean`` aims at valid instances: every required property, values
    inside the bounds, enum members, full pattern matches, array sizes within
    limits, extra properties only where the schema allows them, one branch
    of an ``anyOf``/``oneOf``.  Otherwise the values hug and cross the bounds
    (pattern matches with a trailing newline, lengths and sizes one off,
    numbers next to the bounds, huge and negative-zero numbers), required
    properties go missing and junk is mixed in everywhere.
    """

    MAX_DEPTH: Final = 6

    def __init__(self, root: Any, *, clean: bool) -> None:
        self.root = root
        self.clean = clean

    def value(self, schema: Any, depth: int) -> Strategy:
        if not isinstance(schema, dict) or depth > self.MAX_DEPTH:
            return small_json
        if "$ref" in schema:
            target = self.value(_resolve(self.root, schema["$ref"]), depth + 1)
            if self.clean:
                return target
        options: list[Strategy] = [target] if "$ref" in schema else []
        if "const" in schema:
            options.append(st.just(schema["const"]))
        if "enum" in schema:
            options.append(st.sampled_from(schema["enum"]))
        if self.clean and options:
            return st.one_of(options)
        keys = ("anyOf", "oneOf") if self.clean else ("allOf", "anyOf", "oneOf")
        for key in keys:
            options.extend(self.value(branch, depth + 1) for branch in schema.get(key, []))
        if self.clean and options:
            return st.one_of(options)
        types = schema.get("type", self._implied_type(schema))
        for kind in [types] if isinstance(types, str) else types:
            options.append(self._typed(kind, schema, depth))
        if not self.clean or not options:
            options.append(small_json)
        return st.one_of(options)

    @staticmethod
    def _implied_type(schema: dict[str, Any]) -> list[str]:
        if {"properties", "required", "additionalProperties", "unevaluatedProperties"} & set(
            schema
        ):
            return ["object"]
        if "items" in schema:
            return ["array"]
        if "pattern" in schema or "maxLength" in schema:
            return ["string"]
        return []

    def _typed(self, kind: str, schema: dict[str, Any], depth: int) -> Strategy:
        if kind == "object":
            return self.object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "string":
            return self._string(schema)
        if kind in ("integer", "number"):
            return self._number(schema, integer=kind == "integer")
        if kind == "boolean":
            return st.booleans()
        return st.none()

    def _resolved(self, schema: Any) -> Any:
        if isinstance(schema, dict) and "$ref" in schema:
            return _resolve(self.root, schema["$ref"])
        return schema

    def object(self, schema: dict[str, Any], depth: int) -> Strategy:
        """Objects from the properties of ``schema``, of its ``allOf`` branches
        and of one of its object-shaped ``anyOf``/``oneOf`` branches."""
        alternatives = [
            branch
            for key in ("anyOf", "oneOf")
            for branch in map(self._resolved, schema.get(key, []))
            if isinstance(branch, dict)
        ]
        if not self.clean:  # all of them at once: more names, more mistakes
            alternatives = [{"allOf": alternatives}] if alternatives else []
        shapes = [
            self._shape([schema, *map(self._resolved, schema.get("allOf", [])), *chosen], depth)
            for chosen in ([[a] for a in alternatives] or [[]])
        ]
        return st.one_of(shapes)

    def _shape(self, parts: list[Any], depth: int) -> Strategy:
        parts = [p for p in parts if isinstance(p, dict)]
        for part in list(parts):
            nested = map(self._resolved, part.get("allOf", []))
            parts.extend(p for p in nested if isinstance(p, dict))
        props: dict[str, list[Strategy]] = {}
        required: list[str] = []
        closed = False
        for part in parts:
            for name, sub in part.get("properties", {}).items():
                props.setdefault(name, []).append(self.value(sub, depth + 1))
            required.extend(r for r in part.get("required", []) if r not in required)
            closed = closed or part.get("additionalProperties") is False
            closed = closed or part.get("unevaluatedProperties") is False
        additional = parts[0].get("additionalProperties") if parts else None
        extra = self.value(additional, depth + 1) if isinstance(additional, dict) else small_json
        values = {name: st.one_of(opts) for name, opts in props.items()}
        known = [*props, *required]
        junk_keys = st.one_of(st.sampled_from([*known, "extra", "", "Path"]), st.text(max_size=4))
        clean = self.clean

        @st.composite
        def build(draw: st.DrawFn) -> dict[str, Any]:
            chosen: list[str] = []
            if clean or draw(st.integers(0, 3)) > 0:
                chosen.extend(required)
            if values:
                chosen.extend(
                    draw(st.lists(st.sampled_from(list(values)), unique=True, max_size=5))
                )
            out: dict[str, Any] = {}
            for name in chosen:
                if name not in out:
                    out[name] = draw(values[name]) if name in values else draw(extra)
            if (not clean or not closed) and draw(st.integers(0, 3)) == 0:
                keys = st.text(max_size=4).filter(lambda k: k not in props) if clean else junk_keys
                out.update(draw(st.dictionaries(keys, extra, max_size=2)))
            if not clean and out and draw(st.integers(0, 7)) == 0:
                del out[draw(st.sampled_from(list(out)))]
            return out

        return build()

    def _array(self, schema: dict[str, Any], depth: int) -> Strategy:
        items = schema.get("items")
        element = self.value(items, depth + 1) if isinstance(items, dict) else small_json
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if self.clean:
            top = low + 3 if high is None else min(high, low + 3)
            if schema.get("uniqueItems"):
                return st.lists(element, min_size=low, max_size=top, unique_by=_canonical_json)
            return st.lists(element, min_size=low, max_size=top)
        sizes = {0, 1, 2, 3, low - 1, low, low + 1}
        if high is not None:
            sizes |= {high - 1, high, high + 1}
        choices = sorted(n for n in sizes if 0 <= n <= 25)

        def sized(n: int) -> Strategy:
            lists = st.lists(element, min_size=n, max_size=n)
            if schema.get("uniqueItems") and n:
                return st.one_of(lists, lists.map(lambda v: [*v[:-1], v[0]]))
            return lists

        return st.sampled_from(choices).flatmap(sized)

    def _string(self, schema: dict[str, Any]) -> Strategy:
        pattern = schema.get("pattern")
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if self.clean:
            if pattern is not None:
                return st.from_regex(pattern, fullmatch=True)
            return st.text(min_size=low, max_size=low + 8 if high is None else min(high, low + 8))
        options: list[Strategy] = [st.text(max_size=8)]
        if pattern is not None:
            options += [st.from_regex(pattern, fullmatch=True), st.from_regex(pattern)]
            options.append(st.from_regex(pattern, fullmatch=True).map(lambda s: s + "\n"))
        for n in [low] if high is None else [low, high]:
            options.append(
                st.builds(
                    lambda c, k: c * k,
                    st.sampled_from(["a", "é", "\n", "\U0001f600"]),
                    st.sampled_from([max(n - 1, 0), n, n + 1]),
                )
            )
        return st.one_of(options)

    def _number(self, schema: dict[str, Any], *, integer: bool) -> Strategy:
        bounds = {
            key: schema[key]
            for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
            if isinstance(schema.get(key), int | float) and not isinstance(schema[key], bool)
        }
        if self.clean:
            low = bounds.get("minimum", bounds.get("exclusiveMinimum"))
            high = bounds.get("maximum", bounds.get("exclusiveMaximum"))
            if integer:
                return st.integers(
                    None if low is None else math.floor(low) + ("exclusiveMinimum" in bounds),
                    None if high is None else math.ceil(high) - ("exclusiveMaximum" in bounds),
                )
            return st.floats(
                low,
                high,
                allow_nan=False,
                allow_infinity=False,
                exclude_min="exclusiveMinimum" in bounds,
                exclude_max="exclusiveMaximum" in bounds,
            )
        near = [b + d for b in bounds.values() for d in (-1, 0, 1, 0.5, -1e-9)]
        near += [float(b) for b in bounds.values()]
        special = [0, -0.0, 1.0, 2.5, 1e300, -1e300, 2**63, 2**64, -(2**63) - 1, 10**4299, 5e-324]
        options: list[Strategy] = [st.sampled_from(special)]
        if near:
            options.append(st.sampled_from(near))
        options.append(
            st.integers() if integer else st.floats(allow_nan=False, allow_infinity=False)
        )
        return st.one_of(options)


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


@functools.cache
def _instances(name: str) -> Strategy:
    schema = FIXTURE_SCHEMAS[name]
    return st.one_of(
        _Guided(schema, clean=True).object(schema, 0),
        _Guided(schema, clean=False).object(schema, 0),
        st.dictionaries(st.text(max_size=5), small_json, max_size=4),
    )


#: Lowered (a third of the profile's count, at least 10): this test runs once
#: per fixture schema (85 of them) and each example costs several
#: milliseconds to generate, so the profile's full count for every schema
#: would take the CI profile past its one-minute budget on a 2-core machine.
_PROFILE: Final = settings.default
DIFFERENTIAL_EXAMPLES: Final = max(10, (100 if _PROFILE is None else _PROFILE.max_examples) // 3)


@pytest.mark.parametrize("name", sorted(FIXTURE_SCHEMAS))
@settings(max_examples=DIFFERENTIAL_EXAMPLES)
@given(data=st.data())
def test_verdicts_match_python_jsonschema(name: str, data: st.DataObject) -> None:
    """SCH-43, SCH-44, SCH-45 (with SCH-12, SCH-25): on instances generated
    from each fixture schema (its own property names, typed values near its
    bounds, junk), ``validate`` accepts exactly when python ``jsonschema``
    4.26 ``Draft202012Validator`` (format not asserted) does, except the
    disagreements listed in ``KNOWN_DISAGREEMENTS``."""
    schema = FIXTURE_SCHEMAS[name]
    instance = data.draw(_instances(name), label="instance")
    before = copy.deepcopy(instance)
    result, error = _call(lambda: validate(schema, instance))
    if error is None:
        assert result is instance
    else:
        assert error.error_class is ErrorClass.VALIDATION, error
    ours = error is None
    theirs = _python_validators(name)[0].is_valid(instance)
    assert _typed(instance) == _typed(before)
    if ours == theirs:
        return
    kind = _disagreement_kind(name, instance, ours)
    message = (
        f"{name}: trio_backplane says {'valid' if ours else 'invalid'}, "
        f"jsonschema says {'valid' if theirs else 'invalid'} (kind {kind}) for {instance!r}"
        + ("" if error is None else f": {error!r}")
    )
    assert kind is not None, message
    assert (name, kind) in KNOWN_DISAGREEMENTS, message


@pytest.mark.parametrize(("name", "kind", "instance"), DISAGREEMENT_EXAMPLES)
def test_known_disagreements_reproduce(name: str, kind: str, instance: Any) -> None:
    """SCH-25 (with SCH-43, SCH-44): each excused disagreement is real, of its
    kind, and we are on the spec's side: we refuse, python ``jsonschema``
    accepts, and python ``jsonschema`` with ECMA-262 pattern semantics refuses."""
    assert (name, kind) in KNOWN_DISAGREEMENTS
    with pytest.raises(Error) as exc:
        validate(FIXTURE_SCHEMAS[name], instance)
    assert exc.value.error_class is ErrorClass.VALIDATION
    assert "pattern" in [e["keyword"] for e in exc.value.details["errors"]]
    plain, ecma = _python_validators(name)
    assert plain.is_valid(instance)
    assert not ecma.is_valid(instance)
    assert _disagreement_kind(name, instance, ours=False) == kind


# ---------------------------------------------------------------------------
# (e) metamorphic test on the official suite

_CONFORMANCE = Path(__file__).resolve().parents[2] / "conformance"
if str(_CONFORMANCE) not in sys.path:
    sys.path.insert(0, str(_CONFORMANCE))


@functools.cache
def _suite() -> tuple[list[Any], dict[str, Any]] | str:
    """(required cases, remotes registry), or why the suite could not be fetched."""
    fetch: ModuleType = importlib.import_module("fetch")
    suite: ModuleType = importlib.import_module("suite")
    try:
        root = fetch.suite_dir()
    except fetch.FetchError as exc:
        return str(exc)
    return suite.required_cases(root), suite.remotes(root)


def _require_suite() -> tuple[list[Any], dict[str, Any]]:
    loaded = _suite()
    if isinstance(loaded, str):
        reason = f"JSON-Schema-Test-Suite could not be fetched: {loaded}"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason + " (set CI to make this a failure)")
    return loaded


REWRITE_ID: Final = "https://rewrite.test/root.json"
_ROOT_IDENTITY: Final = ("$id", "$schema", "$anchor", "$dynamicAnchor", "$vocabulary")


def _nodes(value: Any) -> Iterator[dict[str, Any]]:
    """Every object in ``value`` (data inside ``const``/``enum`` included:
    counting those only makes the rewrites rarer, never wrong)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _refs(schema: Any) -> Iterator[str]:
    for node in _nodes(schema):
        for key in ("$ref", "$dynamicRef"):
            if isinstance(node.get(key), str):
                yield node[key]


def _uses(schema: Any, *keys: str) -> bool:
    return any(key in node for node in _nodes(schema) for key in keys)


def _can_move(schema: Any) -> bool:
    """Can ``schema`` become a subschema of a new root without changing what
    it means?  Not if its root carries resource identity (``$id``,
    ``$schema``, anchors, ``$vocabulary``) or a reference is a JSON pointer
    into the document (``#`` or ``#/...``), which would now start elsewhere."""
    if not isinstance(schema, dict) or any(key in schema for key in _ROOT_IDENTITY):
        return False
    return not any(ref == "#" or ref.startswith("#/") for ref in _refs(schema))


def _can_add_id(schema: Any) -> bool:
    """Giving the root an ``$id`` changes only the base URI: safe unless some
    reference or nested ``$id`` is relative (not a fragment, no scheme)."""
    if not isinstance(schema, dict) or "$id" in schema:
        return False
    ids = [node["$id"] for node in _nodes(schema) if isinstance(node.get("$id"), str)]
    for uri in [*_refs(schema), *ids]:
        if not uri.startswith("#") and not urllib.parse.urlsplit(uri).scheme:
            return False
    return True


def _hoist_dialect(schema: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``{"$schema": ...}`` for the new root, the schema without it).

    Almost every suite schema declares ``$schema`` (the Draft 2020-12 URI) at
    its root, which may not stay on a subschema.  Declaring it on the new root
    instead keeps the dialect of the whole document (SCH-01: 2020-12 either
    way); any other ``$schema`` (a custom meta-schema) stays and blocks the
    move."""
    if schema.get("$schema") in (D2020, D2020 + "#"):
        return {"$schema": schema["$schema"]}, {k: v for k, v in schema.items() if k != "$schema"}
    return {}, schema


def _rewrite(kind: str, schema: Any) -> tuple[str, Any]:
    """(the rewrite applied, the schema); ``"reorder"`` when ``kind`` does not apply."""
    if kind in ("allOf", "defs") and isinstance(schema, dict):
        dialect, rest = _hoist_dialect(schema)
        if kind == "allOf" and _can_move(rest):
            return kind, {**dialect, "allOf": [rest]}
        if _can_move(rest) and not _uses(rest, "$dynamicRef", "$dynamicAnchor"):
            return kind, {**dialect, "$defs": {"moved": rest}, "$ref": "#/$defs/moved"}
    if kind == "id" and _can_add_id(schema):
        return kind, {"$id": REWRITE_ID, **schema}
    return "reorder", schema


@given(data=st.data())
def _metamorphic(data: st.DataObject) -> None:
    cases, registry = _require_suite()
    case = data.draw(st.sampled_from(cases), label="case")
    kind = data.draw(st.sampled_from(["reorder", "allOf", "defs", "id"]), label="rewrite")
    rng = data.draw(st.randoms(use_true_random=False), label="rng")
    applied, schema = _rewrite(kind, case.schema)
    instance = case.data
    if applied == "reorder" or data.draw(st.booleans(), label="also reorder"):
        schema, instance = _reorder(schema, rng), _reorder(instance, rng)
    note(f"{case.id}: {applied}: {json.dumps(schema)[:2000]}")
    result, error = _call(lambda: validate_output(schema, instance, schema_registry=registry))
    if error is None:
        assert result is instance
    else:
        assert error.error_class is ErrorClass.VALIDATION, f"{case.id}: {error!r}"
    assert (error is None) == case.valid, (
        f"{case.id} ({case.path}) after {applied}: expected "
        f"{'valid' if case.valid else 'invalid'}, got {'valid' if error is None else error!r}"
    )


def test_suite_verdicts_survive_rewrites() -> None:
    """SCH-42 (with SCH-01, SCH-17, SCH-46): a sampled required case of the
    official suite keeps its verdict through ``validate_output`` (suite
    remotes as ``schema_registry``, one dict) after a verdict-preserving
    rewrite: keys reordered at every level of schema and instance, the schema
    wrapped in ``allOf``, moved behind ``$defs`` + ``$ref``, or given an
    ``$id`` (each only where it cannot change resolution; else reordering)."""
    _require_suite()
    _metamorphic()
