"""The schema boundary's behaviours, one test (or more) per SCH item."""

from __future__ import annotations

import copy
import json
import math
import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trio_backplane import Error, ErrorClass
from trio_backplane.schema import (
    Limits,
    SchemaOptions,
    _preflight,
    _recursion,
    cache_clear,
    cache_info,
    check_bounds,
    compile,
    compile_output,
    validate,
    validate_output,
    validate_schema,
)
from trio_backplane.schema._instance import json_pointer
from trio_backplane.schema._options import normalize_dialects

D2020 = "https://json-schema.org/draft/2020-12/schema"
D07 = "http://json-schema.org/draft-07/schema#"


def refused(exc: pytest.ExceptionInfo[Error], cls: ErrorClass) -> dict[str, Any]:
    assert exc.value.error_class is cls, exc.value
    return dict(exc.value.details)


def nested(depth: int, leaf: Any = None) -> dict[str, Any]:
    """A schema of ``depth`` JSON levels: {"not": {"not": ... {}}}."""
    schema: dict[str, Any] = {} if leaf is None else leaf
    for _ in range(depth - 1):
        schema = {"not": schema}
    return schema


# -- dialects and vocabularies ---------------------------------------------


@pytest.mark.parametrize("declared", [None, D2020, D2020 + "#"])
def test_sch_01_default_and_exact_dialect(declared: str | None) -> None:
    """SCH-01: no $schema, or the exact 2020-12 URI with or without '#'."""
    schema: dict[str, Any] = {"type": "object", "prefixItems": [{"type": "string"}]}
    if declared:
        schema["$schema"] = declared
    # prefixItems exists only in 2020-12: it must bite
    schema = {**schema, "properties": {"a": {"prefixItems": [{"type": "string"}]}}}
    validate(schema, {"a": ["x"]})
    with pytest.raises(Error) as exc:
        validate(schema, {"a": [1]})
    refused(exc, ErrorClass.VALIDATION)


@pytest.mark.parametrize(
    "declared",
    [
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-06/schema#",
        D07,
        "https://json-schema.org/draft/2019-09/schema",
        "http://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2020-12/schema/",
        "https://example.test/my-dialect",
    ],
)
def test_sch_02_other_dialects_are_unsupported(declared: str) -> None:
    """SCH-02: older drafts and near misses raise unsupported_capability."""
    with pytest.raises(Error) as exc:
        validate_schema({"$schema": declared, "type": "object"})
    assert refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)["schema"] == declared


def test_sch_02_custom_metaschema_from_registry_is_2020_12() -> None:
    """SCH-02: a registry meta-schema whose own $schema is 2020-12 is accepted."""
    meta = {
        "$schema": D2020,
        "$id": "https://example.test/meta",
        "$vocabulary": {
            "https://json-schema.org/draft/2020-12/vocab/core": True,
            "https://json-schema.org/draft/2020-12/vocab/applicator": True,
            "https://json-schema.org/draft/2020-12/vocab/validation": True,
        },
        "$dynamicAnchor": "meta",
        "allOf": [
            {"$ref": "https://json-schema.org/draft/2020-12/meta/core"},
            {"$ref": "https://json-schema.org/draft/2020-12/meta/applicator"},
            {"$ref": "https://json-schema.org/draft/2020-12/meta/validation"},
        ],
    }
    registry = {"https://example.test/meta": meta}
    schema = {"$schema": "https://example.test/meta", "properties": {"n": {"maximum": 3}}}
    validate(schema, {"n": 2}, schema_registry=registry)
    with pytest.raises(Error) as exc:
        validate(schema, {"n": 4}, schema_registry=registry)
    refused(exc, ErrorClass.VALIDATION)
    # a meta-schema of another dialect is not a custom 2020-12 dialect
    registry07 = {"https://example.test/meta": {**meta, "$schema": D07}}
    with pytest.raises(Error) as exc:
        validate_schema(schema, schema_registry=registry07)
    refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"$schema": D07, "type": "string"}}},
        {"type": "object", "$defs": {"old": {"$id": "old", "$schema": D07}}},
        {
            "type": "object",
            "anyOf": [{"type": "object"}, {"not": {"$schema": "urn:unknown", "type": "null"}}],
        },
    ],
)
def test_sch_03_unsupported_dialect_anywhere(schema: dict[str, Any]) -> None:
    """SCH-03: a nested, $defs or unreachable-branch $schema is refused at preflight."""
    with pytest.raises(Error) as exc:
        validate_schema(schema)
    refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)


def test_sch_03_referenced_registry_entries_only() -> None:
    """SCH-03: registry entries are checked only when referenced."""
    registry = {
        "https://example.test/old": {"$schema": D07, "type": "string"},
        "https://example.test/new": {"type": "string"},
    }
    schema = {"properties": {"a": {"$ref": "https://example.test/new"}}}
    validate(schema, {"a": "x"}, schema_registry=registry)
    with pytest.raises(Error) as exc:
        validate_schema(
            {"properties": {"a": {"$ref": "https://example.test/old"}}},
            schema_registry=registry,
        )
    refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)


def _meta(vocabulary: dict[str, bool], uri: str = "https://example.test/meta") -> dict[str, Any]:
    return {
        "$schema": D2020,
        "$id": uri,
        "$vocabulary": {"https://json-schema.org/draft/2020-12/vocab/core": True, **vocabulary},
        "$dynamicAnchor": "meta",
        "allOf": [{"$ref": "https://json-schema.org/draft/2020-12/meta/core"}],
    }


def test_sch_04_required_unknown_vocabulary() -> None:
    """SCH-04: an unknown required vocabulary is unsupported; an optional one is ignored."""
    schema = {"$schema": "https://example.test/meta", "type": "object"}
    required = {"https://example.test/meta": _meta({"https://example.test/vocab/x": True})}
    with pytest.raises(Error) as exc:
        validate_schema(schema, schema_registry=required)
    assert refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)["vocabulary"] == (
        "https://example.test/vocab/x"
    )
    optional = {"https://example.test/meta": _meta({"https://example.test/vocab/x": False})}
    validate_schema(schema, schema_registry=optional)


def test_sch_05_format_assertion_vocabulary() -> None:
    """SCH-05: supported vocabularies; a required format-assertion vocabulary asserts format."""
    vocab = "https://json-schema.org/draft/2020-12/vocab/"
    meta = _meta(
        {
            vocab + "applicator": True,
            vocab + "validation": True,
            vocab + "unevaluated": True,
            vocab + "meta-data": True,
            vocab + "content": True,
            vocab + "format-assertion": True,
        }
    )
    schema = {"$schema": "https://example.test/meta", "properties": {"ip": {"format": "ipv4"}}}
    registry = {"https://example.test/meta": meta}
    validate(schema, {"ip": "10.0.0.1"}, schema_registry=registry)
    with pytest.raises(Error) as exc:
        validate(schema, {"ip": "nope"}, schema_registry=registry, format_assertion=False)
    refused(exc, ErrorClass.VALIDATION)


# -- roots -------------------------------------------------------------------


@pytest.mark.parametrize("root", [True, False])
def test_sch_06_boolean_root(root: bool) -> None:
    """SCH-06: a boolean tool-schema root is unsupported (root_not_object)."""
    with pytest.raises(Error) as exc:
        validate_schema(root)
    assert refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)["reason"] == "root_not_object"


@pytest.mark.parametrize("root", [[], "object", None, 3, ("type", "object")])
def test_sch_06_non_mapping_root(root: Any) -> None:
    """SCH-06: any other non-mapping root raises validation."""
    with pytest.raises(Error) as exc:
        validate_schema(root)
    refused(exc, ErrorClass.VALIDATION)


@pytest.mark.parametrize("root", [{}, {"type": "object"}, {"type": ["object"]}])
def test_sch_07_object_roots(root: dict[str, Any]) -> None:
    """SCH-07: missing type, "object" or ["object"] is accepted."""
    validate_schema(root)


@pytest.mark.parametrize("kind", ["array", "string", ["object", "null"], ["null"], []])
def test_sch_07_other_root_types(kind: Any) -> None:
    """SCH-07: any other root type raises unsupported_capability root_not_object."""
    with pytest.raises(Error) as exc:
        validate_schema({"type": kind})
    assert refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)["reason"] == "root_not_object"


def test_sch_08_boolean_subschemas() -> None:
    """SCH-08: nested boolean subschemas."""
    schema = {"properties": {"x": False, "y": True}}
    validate(schema, {"y": [1, {"z": None}]})
    with pytest.raises(Error) as exc:
        validate(schema, {"x": 1})
    refused(exc, ErrorClass.VALIDATION)


# -- arguments -----------------------------------------------------------------


def test_sch_09_returns_the_same_object_unchanged() -> None:
    """SCH-09: the very object comes back, deep-equal to a copy taken before."""
    schema = {
        "properties": {"a": {"type": "integer", "default": 3}, "b": {"type": "string"}},
        "required": ["b"],
    }
    arguments = {"b": "x", "extra": [1, {"k": None}]}
    before = copy.deepcopy(arguments)
    assert validate(schema, arguments) is arguments
    assert compile(schema).validate(arguments) is arguments
    assert arguments == before


def test_sch_10_no_defaults_no_coercion_no_trimming() -> None:
    """SCH-10: no default inserted, no coercion, unknown properties kept."""
    schema = {"properties": {"n": {"type": "integer", "default": 5}}}
    arguments: dict[str, Any] = {"unknown": True}
    validate(schema, arguments)
    assert arguments == {"unknown": True}
    with pytest.raises(Error) as exc:
        validate(schema, {"n": "5"})
    refused(exc, ErrorClass.VALIDATION)


class _Sub(dict[str, Any]):
    pass


@pytest.mark.parametrize(
    "arguments",
    [
        [],
        "x",
        None,
        _Sub(a=1),
        {"a": (1, 2)},
        {"a": {1, 2}},
        {"a": b"bytes"},
        {1: "non-str key"},
        {"a": {"b": {2: 3}}},
        {"a": float("nan")},
        {"a": [float("inf")]},
        {"a": -float("inf")},
        {"a": "\ud800"},
        {"a": object()},
    ],
)
def test_sch_11_non_json_arguments(arguments: Any) -> None:
    """SCH-11: non-mappings and values outside the JSON data model raise validation."""
    evaluated: list[Any] = []

    class Spy:
        def __init__(self, parent: Any, value: Any, path: Any) -> None:
            pass

        def validate(self, instance: Any) -> None:  # pragma: no cover - must not run
            evaluated.append(instance)

    with pytest.raises(Error) as exc:
        validate({"type": "object"}, arguments)
    refused(exc, ErrorClass.VALIDATION)
    assert evaluated == []


def test_sch_12_bool_is_not_a_number() -> None:
    """SCH-12: True is not an integer or a number, distinct from 1; 1 == 1.0."""
    for kind in ("integer", "number"):
        with pytest.raises(Error):
            validate({"properties": {"v": {"type": kind}}}, {"v": True})
    with pytest.raises(Error):
        validate({"properties": {"v": {"enum": [1]}}}, {"v": True})
    with pytest.raises(Error):
        validate({"properties": {"v": {"const": True}}}, {"v": 1})
    validate({"properties": {"v": {"uniqueItems": True}}}, {"v": [1, True]})
    validate({"properties": {"v": {"const": 1}}}, {"v": 1.0})
    validate({"properties": {"v": {"type": "integer"}}}, {"v": 1.0})


def test_sch_13_format_is_annotation_by_default() -> None:
    """SCH-13: format annotates unless format_assertion=True."""
    schema = {"properties": {"e": {"format": "email"}}}
    validate(schema, {"e": "not an email"})
    with pytest.raises(Error) as exc:
        validate(schema, {"e": "not an email"}, format_assertion=True)
    refused(exc, ErrorClass.VALIDATION)
    validate(schema, {"e": "a@example.test"}, format_assertion=True)


def test_sch_14_content_keywords() -> None:
    """SCH-14: content keywords annotate by default, assert when asked, never decode."""
    schema = {
        "properties": {
            "blob": {"contentEncoding": "base64"},
            "doc": {
                "contentMediaType": "application/json",
                "contentSchema": {"type": "object", "required": ["k"]},
            },
        }
    }
    bad = {"blob": "not base64!", "doc": "[1"}
    assert validate(schema, bad) == {"blob": "not base64!", "doc": "[1"}
    with pytest.raises(Error) as exc:
        validate(schema, {"blob": "not base64!"}, content_assertion=True)
    refused(exc, ErrorClass.VALIDATION)
    with pytest.raises(Error):
        validate(schema, {"doc": "[1"}, content_assertion=True)
    with pytest.raises(Error):
        validate(schema, {"doc": '{"other": 1}'}, content_assertion=True)
    good = {"blob": "aGVsbG8=", "doc": '{"k": 1}'}
    assert validate(schema, good, content_assertion=True) == {
        "blob": "aGVsbG8=",
        "doc": '{"k": 1}',
    }
    with pytest.raises(Error) as exc:
        validate_schema({"properties": {"x": {"contentEncoding": "rot13"}}}, content_assertion=True)
    refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)


_ENCODED = {
    # encoding: (valid "hello" text, invalid text)
    "base64": ("aGVsbG8=", "aGVsbG8"),  # missing padding
    "BASE64": ("aGVsbG8=", "aGV sbG8="),  # names are case-insensitive; no blanks
    "base64url": ("aGVsbG8_", "aGVsbG8/"),  # "/" is the other alphabet
    "base32": ("NBSWY3DP", "NBSWY3D1"),  # "1" is not in the alphabet
    "base16": ("68656C6C6F", "68656C6C6"),  # odd length
}


@pytest.mark.parametrize("encoding", sorted(_ENCODED))
def test_sch_14_each_content_encoding_asserts(encoding: str) -> None:
    """SCH-14: every supported ``contentEncoding`` decodes a valid string and
    refuses an invalid one, only with ``content_assertion``; the argument
    comes back as sent (never decoded) in both modes."""
    valid, invalid = _ENCODED[encoding]
    schema = {"properties": {"blob": {"contentEncoding": encoding}}}
    assert validate(schema, {"blob": valid}, content_assertion=True) == {"blob": valid}
    assert validate(schema, {"blob": invalid}) == {"blob": invalid}
    with pytest.raises(Error) as exc:
        validate(schema, {"blob": invalid}, content_assertion=True)
    refused(exc, ErrorClass.VALIDATION)
    # a non-string instance is not content: the keyword does not apply
    assert validate(schema, {"blob": 7}, content_assertion=True) == {"blob": 7}


def test_sch_30_decoded_content_is_held_to_the_schemas_instance_limits() -> None:
    """SCH-30, SCH-32: JSON content decoded for ``contentSchema`` is held to
    the same ``max_input_depth`` as the arguments, as the host configured it
    (not to a fixed bound): a limit, never a mismatch, and content within a
    raised limit is checked, not refused.  (Its size is bounded too, but
    decoded content is never larger than the arguments holding it.)"""
    schema = {
        "properties": {
            "d": {
                "contentMediaType": "application/json",
                "contentSchema": {"not": {"type": "string"}},
            }
        }
    }

    def options(**limits: int) -> dict[str, Any]:
        return {"content_assertion": True, "limits": attrs.evolve(Limits(), **limits)}

    deep = json.dumps(_deep_list(150))  # 150 levels: past the default 128
    raised = options(max_input_depth=200)
    assert validate(schema, {"d": deep}, **raised) == {"d": deep}
    deeper = json.dumps(_deep_list(600))
    with pytest.raises(Error) as exc:
        validate(schema, {"d": deeper}, **options(max_input_depth=256))
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["maximum"] == 256
    with pytest.raises(Error) as exc:
        validate(schema, {"d": json.dumps(_deep_list(20))}, **options(max_input_depth=10))
    assert refused(exc, ErrorClass.EXECUTION_FAILURE) == {
        "reason": "input_too_deep",
        "limit": "max_input_depth",
        "maximum": 10,
        "role": "content",
    }


def test_sch_14_text_media_types_assert_utf8_after_decoding() -> None:
    """SCH-14: a ``text/*`` media type asserts that the (decoded) bytes are
    UTF-8 text; a JSON one with ``contentSchema`` checks the parsed value,
    which must be JSON data (no NaN); past the input limits it is a limit
    (SCH-30)."""
    text = {
        "properties": {
            "t": {"contentMediaType": "text/plain; charset=utf-8", "contentEncoding": "base64"}
        }
    }
    assert validate(text, {"t": "aMOpbGxv"}, content_assertion=True) == {"t": "aMOpbGxv"}
    with pytest.raises(Error) as exc:  # b"\xff\xfe" is not UTF-8
        validate(text, {"t": "//4="}, content_assertion=True)
    refused(exc, ErrorClass.VALIDATION)
    json_doc = {
        "properties": {
            "d": {
                "contentMediaType": "application/vnd.api+json",
                "contentSchema": {"type": "array"},
            }
        }
    }
    assert validate(json_doc, {"d": "[1, 2]"}, content_assertion=True) == {"d": "[1, 2]"}
    for bad in ("[NaN]", "{}"):
        with pytest.raises(Error) as exc:
            validate(json_doc, {"d": bad}, content_assertion=True)
        refused(exc, ErrorClass.VALIDATION)
    with pytest.raises(Error) as exc:  # past the input limits: a limit, never a mismatch
        validate(json_doc, {"d": "[" * 200 + "]" * 200}, content_assertion=True)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "input_too_deep"
    # contentSchema applies only to a JSON media type: here it is an annotation
    plain = {
        "properties": {"c": {"contentMediaType": "text/csv", "contentSchema": {"type": "array"}}}
    }
    assert validate(plain, {"c": "a,b"}, content_assertion=True) == {"c": "a,b"}


@pytest.mark.parametrize(
    ("node", "detail"),
    [
        ({"contentEncoding": "quoted-printable"}, ("encoding", "quoted-printable")),
        ({"contentMediaType": "image/png"}, ("media_type", "image/png")),
    ],
)
def test_sch_14_unassertable_content_keywords_fail_closed(
    node: dict[str, Any], detail: tuple[str, str]
) -> None:
    """SCH-14: with ``content_assertion`` a content keyword the boundary
    cannot assert is refused at preflight (never silently annotated), with
    where it is; without it the same schema is fine."""
    schema = {"properties": {"x": node}}
    validate_schema(schema)
    with pytest.raises(Error) as exc:
        validate_schema(schema, content_assertion=True)
    details = refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)
    assert details[detail[0]] == detail[1]
    assert details["path"] == "/properties/x"


def _in_content(sub: Any, **extra: Any) -> dict[str, Any]:
    """A tool schema whose ``p`` holds JSON text that must match ``sub``."""
    content = {"type": "string", "contentMediaType": "application/json", "contentSchema": sub}
    return {"type": "object", "properties": {"p": content}, **extra}


@pytest.mark.parametrize(
    "wrap",
    [lambda c: c, lambda c: {"not": c}, lambda c: {"anyOf": [c, {"type": "integer"}]}],
)
def test_sch_14_sch_29_sch_30_content_schema_regex_work_limit(wrap: Any) -> None:
    """SCH-14, SCH-29, SCH-30: a pattern inside ``contentSchema`` runs under
    the same work limit, and exhausting it raises execution_failure
    ``regex_work_limit`` even through ``not`` (never a pass or a mismatch)."""
    content = _in_content({"pattern": EXPLOSIVE})["properties"]["p"]
    schema = {"type": "object", "properties": {"p": wrap(content)}}
    with pytest.raises(Error) as exc:
        validate(schema, {"p": json.dumps(VICTIM)}, content_assertion=True)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "regex_work_limit"
    # the validator's own failure path (iter_errors) says the same
    with pytest.raises(Error) as exc:
        compile(schema, content_assertion=True).errors({"p": json.dumps(VICTIM)})
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "regex_work_limit"


def test_sch_13_sch_14_format_asserted_inside_content_schema() -> None:
    """SCH-13, SCH-14: ``format_assertion=True`` applies inside ``contentSchema``."""
    schema = _in_content({"type": "string", "format": "email"})
    assert validate(schema, {"p": '"nope"'}, content_assertion=True) == {"p": '"nope"'}
    with pytest.raises(Error) as exc:
        validate(schema, {"p": '"nope"'}, content_assertion=True, format_assertion=True)
    refused(exc, ErrorClass.VALIDATION)
    ok = {"p": '"a@example.test"'}
    assert validate(schema, ok, content_assertion=True, format_assertion=True) == ok


def test_sch_14_content_schema_references_resolve_in_the_document() -> None:
    """SCH-14: ``contentSchema`` references resolve against the enclosing
    document (its ``$defs``, an embedded ``$id`` resource, a registry entry),
    and a recursive one terminates."""
    local = _in_content({"$ref": "#/$defs/n"}, **{"$defs": {"n": {"type": "integer"}}})
    validate_schema(local, content_assertion=True)
    assert validate(local, {"p": "5"}, content_assertion=True) == {"p": "5"}
    with pytest.raises(Error) as exc:
        validate(local, {"p": '"x"'}, content_assertion=True)
    refused(exc, ErrorClass.VALIDATION)
    embedded = {
        "type": "object",
        "$defs": {"n": {"type": "integer"}},
        "properties": {
            "q": {
                "$id": "https://example.test/inner",
                "$defs": {"n": {"type": "string"}},
                **_in_content({"$ref": "#/$defs/n"}),
            }
        },
    }
    assert validate(embedded, {"q": {"p": '"x"'}}, content_assertion=True)
    with pytest.raises(Error):
        validate(embedded, {"q": {"p": "5"}}, content_assertion=True)
    registry = {"https://example.test/n": {"type": "integer"}}
    remote = _in_content({"$ref": "https://example.test/n"})
    assert validate(remote, {"p": "5"}, content_assertion=True, schema_registry=registry)
    with pytest.raises(Error):
        validate(remote, {"p": "[]"}, content_assertion=True, schema_registry=registry)
    recursive = _in_content({"$ref": "#"})  # JSON text holding JSON text ...
    inner = {"p": json.dumps({"p": json.dumps({})})}
    assert validate(recursive, inner, content_assertion=True) == inner
    with pytest.raises(Error):
        validate(recursive, {"p": json.dumps({"p": "[1"})}, content_assertion=True)


def test_sch_15_unknown_keywords_are_annotations() -> None:
    """SCH-15: x-mcp-header and typos annotate and change no verdict."""
    schema = {"properties": {"a": {"type": "string", "x-mcp-header": "A", "maxLenght": 1}}}
    validate(schema, {"a": "long string"})
    with pytest.raises(Error):
        validate(schema, {"a": 1})


# -- references ------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    ["https://example.test/s.json", "http://example.test/s", "file:///etc/passwd", "other.json"],
)
def test_sch_16_external_reference_needs_a_loader(ref: str) -> None:
    """SCH-16: a non-local reference without registry or loader is refused at preflight."""
    with pytest.raises(Error) as exc:
        validate_schema({"properties": {"a": {"$ref": ref}}})
    details = refused(exc, ErrorClass.VALIDATION)
    assert details["reference"] == ref
    assert exc.value.message == "external schema reference requires an explicit loader"


def test_sch_16_bundled_metaschema_is_not_external() -> None:
    """SCH-16: a reference to the bundled 2020-12 meta-schema needs no loader."""
    schema = {"properties": {"s": {"$ref": D2020}}}
    validate(schema, {"s": {"type": "string"}})
    with pytest.raises(Error):
        validate(schema, {"s": {"type": 12}})


def test_sch_17_registry_resolves() -> None:
    """SCH-17: a registry entry resolves and its constraint applies."""
    registry = {"https://example.test/name": {"type": "string"}}
    schema = {"properties": {"n": {"$ref": "https://example.test/name"}}}
    validate(schema, {"n": "x"}, schema_registry=registry)
    with pytest.raises(Error) as exc:
        validate(schema, {"n": 1}, schema_registry=registry)
    refused(exc, ErrorClass.VALIDATION)


def test_sch_18_loader_gets_uri_without_fragment() -> None:
    """SCH-18: the loader sees the URI without fragment; registry + loader is refused."""
    seen: list[str] = []

    def loader(uri: str) -> Any:
        seen.append(uri)
        return {"$defs": {"n": {"type": "integer"}}}

    schema = {"properties": {"n": {"$ref": "https://example.test/defs.json#/$defs/n"}}}
    validate(schema, {"n": 1}, schema_loader=loader)
    assert seen == ["https://example.test/defs.json"]
    with pytest.raises(Error):
        validate(schema, {"n": "x"}, schema_loader=loader)
    with pytest.raises(Error) as exc:
        validate_schema(schema, schema_registry={}, schema_loader=loader)
    refused(exc, ErrorClass.VALIDATION)


@pytest.mark.parametrize("outcome", ["raise", "list", "string", "none"])
def test_sch_19_failing_loader(outcome: str) -> None:
    """SCH-19: a loader that raises or returns a non-schema is execution_failure."""

    def loader(uri: str) -> Any:
        if outcome == "raise":
            raise OSError("disk on fire")
        return {"list": [], "string": "{}", "none": None}[outcome]

    ref = "https://example.test/x.json"
    with pytest.raises(Error) as exc:
        validate_schema({"$ref": ref}, schema_loader=loader)
    details = refused(exc, ErrorClass.EXECUTION_FAILURE)
    assert details["reference"] == ref
    assert exc.value.message == "external schema reference could not be loaded"


@pytest.mark.parametrize("outcome", ["raise", "list", "number"])
def test_sch_19_failing_loader_for_a_custom_metaschema(outcome: str) -> None:
    """SCH-19: a loader that fails on a custom $schema meta-schema is the same
    execution_failure, never an unsupported dialect (SCH-02)."""

    def loader(uri: str) -> Any:
        if outcome == "raise":
            raise OSError("meta down")
        return {"list": [], "number": 42}[outcome]

    meta = "https://example.test/meta"
    with pytest.raises(Error) as exc:
        validate_schema({"$schema": meta, "type": "object"}, schema_loader=loader)
    details = refused(exc, ErrorClass.EXECUTION_FAILURE)
    assert details["reference"] == meta
    assert exc.value.message == "external schema reference could not be loaded"
    with pytest.raises(Error) as exc:  # a registry without it: an unknown dialect
        validate_schema({"$schema": meta, "type": "object"}, schema_registry={})
    refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)


@pytest.fixture
def no_io(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail loudly on any socket or file open during the test."""
    attempts: list[str] = []
    import builtins
    import io

    def refuse(what: str) -> Any:
        def blocked(*args: Any, **kwargs: Any) -> Any:
            attempts.append(f"{what}{args[:1]}")
            raise AssertionError(f"{what} attempted")

        return blocked

    monkeypatch.setattr(socket, "socket", refuse("socket"))
    monkeypatch.setattr(socket, "create_connection", refuse("connect"))
    monkeypatch.setattr(urllib.request, "urlopen", refuse("urlopen"))
    monkeypatch.setattr(builtins, "open", refuse("open"))
    monkeypatch.setattr(io, "open", refuse("io.open"))
    return attempts


@pytest.mark.parametrize(
    "ref",
    [
        "http://127.0.0.1:9/x.json",
        "https://example.test/x",
        "file:///etc/hostname",
        "/etc/hostname",
        "x.json",
        "#/$defs/missing",
    ],
)
def test_sch_20_no_network_or_file_access(no_io: list[str], ref: str) -> None:
    """SCH-20: compile never opens a connection or a file, whatever the options."""
    for options in ({}, {"schema_registry": {}}, {"allow_external_refs": False}):
        with pytest.raises(Error):
            validate_schema({"$defs": {"unused": {"$ref": ref}}}, **options)
    # the metaschema and unknown $schema URLs are never fetched either
    with pytest.raises(Error):
        validate_schema({"$schema": "https://example.test/dialect", "type": "object"})
    assert no_io == []


@pytest.mark.parametrize("index", ["\u00b2", "\u0663", "01", "+1", " 1"], ids=repr)
def test_sch_21_an_array_index_is_ascii_digits_without_a_leading_zero(index: str) -> None:
    """SCH-21: a pointer token indexes an array only as RFC 6901 writes one
    (ASCII digits, no leading zero): "²" or "٣" (which ``str.isdigit``
    takes) resolve nowhere, a classed ``validation`` "unresolved", never a
    raw ValueError, and never another item."""
    schema = {
        "type": "object",
        "prefixItems": [True, True, True, True],
        "properties": {"a": {"$ref": f"#/prefixItems/{index}"}},
    }
    with pytest.raises(Error) as exc:
        validate_schema(schema)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "unresolved"


@pytest.mark.parametrize("ref", ["#/$defs/missing", "#nowhere", "#/properties/a/items"])
def test_sch_21_local_reference_must_resolve(ref: str) -> None:
    """SCH-21: unresolved local references fail validate_schema, even unused."""
    with pytest.raises(Error) as exc:
        validate_schema({"properties": {"a": {}}, "$defs": {"unused": {"$ref": ref}}})
    assert refused(exc, ErrorClass.VALIDATION)["reference"] == ref


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {"a": {"minimum": "3"}}},
        {"required": "a"},
        {"properties": {"a": {"type": "strin"}}},
        {"properties": {"a": {"minLength": -1}}},
        {"properties": 5},
    ],
)
def test_sch_22_metaschema_violations(schema: dict[str, Any]) -> None:
    """SCH-22: a schema that breaks the Draft 2020-12 meta-schema raises validation."""
    with pytest.raises(Error) as exc:
        validate_schema(schema)
    refused(exc, ErrorClass.VALIDATION)


def test_sch_23_error_entries() -> None:
    """SCH-23: each failure is {instance_path, schema_path, keyword, message}."""
    schema = {
        "properties": {
            "n": {"type": "integer", "maximum": 3},
            "tags": {"items": {"type": "string"}},
        },
        "required": ["id"],
    }
    with pytest.raises(Error) as exc:
        validate(schema, {"n": 7, "tags": ["ok", 2]})
    errors = refused(exc, ErrorClass.VALIDATION)["errors"]
    by_keyword = {e["keyword"]: e for e in errors}
    assert set(by_keyword) == {"maximum", "type", "required"}
    assert by_keyword["maximum"]["instance_path"] == "/n"
    assert by_keyword["maximum"]["schema_path"] == "/properties/n/maximum"
    assert by_keyword["type"]["instance_path"] == "/tags/1"
    assert by_keyword["required"]["instance_path"] == ""
    assert all(set(e) == {"instance_path", "schema_path", "keyword", "message"} for e in errors)
    assert all(isinstance(e["message"], str) and e["message"] for e in errors)


def test_sch_23_error_entries_are_bounded() -> None:
    """SCH-23: the entry list is bounded; the count says how many there were."""
    schema = {"additionalProperties": {"type": "string"}}
    arguments = {f"k{i}": i for i in range(100)}
    with pytest.raises(Error) as exc:
        validate(schema, arguments)
    details = refused(exc, ErrorClass.VALIDATION)
    assert len(details["errors"]) == 16
    assert details["error_count"] == 100


def test_sch_23_a_recursive_schema_reports_its_first_error_only() -> None:
    """SCH-23: collecting every error of a recursive schema can grow
    exponentially with the instance's nesting (here each level re-enters two
    branches: 2**40 errors for 40 levels, a schema SCH-33 now refuses), so
    for a schema whose references recurse the engine's first error is
    reported, marked as such; the verdict is the same.  A schema without
    recursion still lists them all."""
    recursive = {
        "type": "object",
        "$defs": {"X": {"properties": {"c": {"$ref": "#"}, "n": {"type": "string"}}}},
        "allOf": [{"$ref": "#/$defs/X"}, {"properties": {"n": {"minLength": 1}}}],
    }
    deep: dict[str, Any] = {"n": 1}
    for _ in range(40):
        deep = {"c": deep}
    with pytest.raises(Error) as exc:
        validate(recursive, deep)
    details = refused(exc, ErrorClass.VALIDATION)
    assert details["first_error_only"] is True
    assert details["error_count"] == 1
    [entry] = details["errors"]
    assert entry["keyword"] == "type"
    assert entry["instance_path"] == "/c" * 40 + "/n"
    shallow = {"c": {"n": "fine"}, "n": "fine"}
    assert validate(recursive, shallow) is shallow
    flat = {"additionalProperties": {"type": "string"}}
    with pytest.raises(Error) as exc:
        validate(flat, {"a": 1, "b": 2})
    details = refused(exc, ErrorClass.VALIDATION)
    assert "first_error_only" not in details
    assert details["error_count"] == 2


def test_sch_24_every_branch_is_preflighted() -> None:
    """SCH-24: a malformed pattern in an anyOf branch no argument reaches fails preflight."""
    schema = {
        "properties": {"a": {"type": "string"}},
        "anyOf": [{"type": "object"}, {"properties": {"never": {"pattern": "(unclosed"}}}],
        "$defs": {"absent": {"properties": {"x": {"minimum": "1"}}}},
    }
    with pytest.raises(Error) as exc:
        validate_schema(schema)
    refused(exc, ErrorClass.VALIDATION)
    del schema["anyOf"]
    with pytest.raises(Error):
        validate_schema(schema)


# -- patterns ------------------------------------------------------------------------


def test_sch_25_pattern_search_and_dollar() -> None:
    """SCH-25: patterns search; $ matches only at the end of input."""
    validate({"properties": {"s": {"pattern": "b"}}}, {"s": "abc"})
    validate({"patternProperties": {"b": {"type": "integer"}}}, {"abc": 1})
    with pytest.raises(Error):
        validate({"patternProperties": {"b": {"type": "integer"}}}, {"abc": "x"})
    with pytest.raises(Error):
        validate({"properties": {"s": {"pattern": "^abc$"}}}, {"s": "abc\n"})


def test_sch_26_ecma_digit_and_dot() -> None:
    """SCH-26: \\d is ASCII only; . matches no line terminator."""
    digit = {"properties": {"s": {"pattern": "^\\d$"}}}
    validate(digit, {"s": "7"})
    with pytest.raises(Error):
        validate(digit, {"s": "\u0663"})
    dot = {"properties": {"s": {"pattern": "^.$"}}}
    validate(dot, {"s": "x"})
    for terminator in ("\n", "\r", "\u2028", "\u2029"):
        with pytest.raises(Error):
            validate(dot, {"s": terminator})


@pytest.mark.parametrize("pattern", ["(?P<n>a)", "(?i)abc", "\\Aabc\\z", "a++", "[[:alpha:]]"])
def test_sch_27_non_ecma_patterns(pattern: str) -> None:
    """SCH-27: non-ECMA-262 pattern syntax raises validation at preflight."""
    with pytest.raises(Error) as exc:
        validate_schema({"properties": {"s": {"pattern": pattern}}})
    refused(exc, ErrorClass.VALIDATION)
    with pytest.raises(Error):
        validate_schema({"patternProperties": {pattern: {}}})


def test_sch_28_pattern_length() -> None:
    """SCH-28: patterns over 1 024 UTF-8 bytes are pattern_too_long."""
    ok = "a" * 1024
    validate_schema({"properties": {"s": {"pattern": ok}}})
    for too_long in ("a" * 1025, "\u00e9" * 513):
        with pytest.raises(Error) as exc:
            validate_schema({"properties": {"s": {"pattern": too_long}}})
        details = refused(exc, ErrorClass.EXECUTION_FAILURE)
        assert details["reason"] == "pattern_too_long"
        with pytest.raises(Error) as exc:
            validate_schema({"patternProperties": {too_long: {}}})
        assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "pattern_too_long"


EXPLOSIVE = "^(\\w+\\s?)*$(?<=x)"  # backtracking only: lookbehind defeats the linear engine
VICTIM = "a" * 40 + "!"


def test_sch_29_regex_work_limit() -> None:
    """SCH-29: exhausting the regex work limit is execution_failure, not a mismatch."""
    with pytest.raises(Error) as exc:
        validate({"properties": {"s": {"pattern": EXPLOSIVE}}}, {"s": VICTIM})
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "regex_work_limit"


@pytest.mark.parametrize(
    "wrap",
    [
        lambda p: {"not": p},
        lambda p: {"anyOf": [p, {"type": "integer"}]},
        lambda p: {"oneOf": [p, {"type": "integer"}]},
        lambda p: {"if": p, "then": {"minLength": 100}},
        lambda p: {"if": p, "then": True, "else": {"minLength": 100}},
    ],
)
def test_sch_30_regex_failure_propagates(wrap: Any) -> None:
    """SCH-30: a work-limit failure propagates through not, anyOf, oneOf and if."""
    schema = {"properties": {"s": wrap({"pattern": EXPLOSIVE})}}
    with pytest.raises(Error) as exc:
        validate(schema, {"s": VICTIM})
    refused(exc, ErrorClass.EXECUTION_FAILURE)


# -- limits -------------------------------------------------------------------------


def test_sch_31_schema_depth() -> None:
    """SCH-31: 129 JSON levels raise too_deep under the host preset; 128 pass the limit."""
    deep = {"properties": {"a": nested(127)}}  # root + properties object + 127 = 129
    with pytest.raises(Error) as exc:
        validate_schema(deep)
    details = refused(exc, ErrorClass.EXECUTION_FAILURE)
    assert {k: details[k] for k in ("reason", "limit", "maximum")} == {
        "reason": "too_deep",
        "limit": "max_json_depth",
        "maximum": 128,
    }
    assert exc.value.message == "JSON Schema resource limit exceeded"
    # exactly 128 levels pass the JSON-depth limit (the subschema depth, 127, too)
    validate_schema({"properties": {"a": nested(126)}})


def _deep_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_sch_32_argument_depth() -> None:
    """SCH-32: arguments nested 129 levels raise input_too_deep before evaluation."""
    recursive = {
        "properties": {"a": {"$ref": "#/$defs/any"}},
        "$defs": {"any": {"items": {"$ref": "#/$defs/any"}}},
    }
    validate(recursive, {"a": _deep_list(127)})  # root + 127 = 128
    with pytest.raises(Error) as exc:
        validate(recursive, {"a": _deep_list(128)})
    details = refused(exc, ErrorClass.EXECUTION_FAILURE)
    assert details["reason"] == "input_too_deep"
    assert details["limit"] == "max_input_depth"


def test_sch_33_host_preset_sizes_and_counts() -> None:
    """SCH-33: too_large, too_many_subschemas, too_many_refs, input_too_large."""
    big = {"description": "x" * 1_048_576}
    with pytest.raises(Error) as exc:
        validate_schema(big)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "too_large"
    many = {"allOf": [True] * 100_000}  # + root = 100 001 subschemas in ~500 KB
    with pytest.raises(Error) as exc:
        validate_schema(many)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "too_many_subschemas"
    refs = {"$defs": {"t": {}}, "allOf": [{"$ref": "#/$defs/t"}] * 10_001}
    with pytest.raises(Error) as exc:
        validate_schema(refs)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "too_many_refs"
    with pytest.raises(Error) as exc:
        validate({}, {"blob": "x" * 1_048_576})
    details = refused(exc, ErrorClass.EXECUTION_FAILURE)
    assert details["reason"] == "input_too_large"
    assert details["maximum"] == 1_048_576


def fan_out(depth: int) -> dict[str, Any]:
    """Each $defs level is allOf of two $refs to the next: 2**depth evaluations."""
    defs: dict[str, Any] = {
        str(i): {"allOf": [{"$ref": f"#/$defs/{i + 1}"}, {"$ref": f"#/$defs/{i + 1}"}]}
        for i in range(depth)
    }
    defs[str(depth)] = {"type": "string"}
    return {"type": "object", "properties": {"a": {"$ref": "#/$defs/0"}}, "$defs": defs}


@pytest.mark.parametrize("depth", [27, 40, 200])
def test_sch_33_reference_fan_out_is_bounded(depth: int) -> None:
    """SCH-33/SCH-35: a small schema whose references expand to more than ten
    times max_subschemas evaluations is refused before the engine sees it."""
    with pytest.raises(Error) as exc:
        validate_schema(fan_out(depth))
    details = refused(exc, ErrorClass.EXECUTION_FAILURE)
    assert (details["reason"], details["limit"]) == ("ref_fanout", "max_subschemas")
    assert details["maximum"] == 1_000_000
    with pytest.raises(Error) as exc:
        check_bounds(fan_out(depth))
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["maximum"] == 10_000
    validate(fan_out(12), {"a": "x"})  # 2**12 expanded: fine


def test_sch_33_reference_fan_out_boundary() -> None:
    """SCH-33: the expanded size counts each reference as its target's subtree
    and $defs only through references; up to ten times max_subschemas passes,
    and recursion counts once."""
    limits = Limits(max_subschemas=100)

    def schema(refs: int) -> dict[str, Any]:
        return {
            "$defs": {"d": {"anyOf": [{}] * 50}},  # 51 subschemas
            "properties": {f"p{i}": {"$ref": "#/$defs/d"} for i in range(refs)},
        }

    validate_schema(schema(19), limits=limits)  # 1 + 19 * (1 + 51) = 989 ($defs aside)
    with pytest.raises(Error) as exc:
        validate_schema(schema(20), limits=limits)  # 1 041
    details = refused(exc, ErrorClass.EXECUTION_FAILURE)
    assert (details["reason"], details["maximum"]) == ("ref_fanout", 1000)
    tree = {"properties": {"l": {"$ref": "#"}, "r": {"$ref": "#"}}}
    validate(tree, {"l": {"r": {"l": {}}}}, limits=Limits(max_subschemas=3))


def _doubling(applicator: str) -> dict[str, Any]:
    branch = {"type": "object", "properties": {"x": {"$ref": "#/$defs/n"}}, "required": ["x"]}
    return {
        "type": "object",
        "$defs": {"n": {applicator: [branch, dict(branch)]}},
        "properties": {"x": {"$ref": "#/$defs/n"}},
    }


@pytest.mark.parametrize(
    "schema",
    [
        _doubling("anyOf"),
        _doubling("allOf"),
        _doubling("oneOf"),
        {  # two in-place paths to X, both recursing through "c"
            "$defs": {"X": {"properties": {"c": {"$ref": "#"}}}},
            "allOf": [{"$ref": "#/$defs/X"}, {"$ref": "#/$defs/X"}],
        },
        {  # a wildcard may be the same instance child as a named property
            "allOf": [
                {"properties": {"a": {"$ref": "#"}}},
                {"additionalProperties": {"$ref": "#"}},
            ]
        },
        {  # the paths part and meet again a level further down
            "$defs": {
                "n": {"anyOf": [{"$ref": "#/$defs/t"}, {"$ref": "#/$defs/u"}]},
                "t": {"properties": {"x": {"$ref": "#/$defs/m"}}},
                "u": {"additionalProperties": {"$ref": "#/$defs/m"}},
                "m": {"properties": {"y": {"$ref": "#/$defs/n"}}},
            },
            "$ref": "#/$defs/n",
        },
        {"if": {"properties": {"a": {"$ref": "#"}}}, "then": {"properties": {"a": {"$ref": "#"}}}},
    ],
)
def test_sch_33_recursion_that_multiplies_per_level_withholds_its_errors(
    schema: dict[str, Any],
) -> None:
    """SCH-33: recursion in which one instance location is evaluated by a
    schema through two in-place paths doubles the engine's work per level of
    the instance when it collects errors (2**d for an invalid instance d
    levels deep: the first error of an anyOf took a minute at depth 18; the
    verdict itself stays immediate).  Such a schema is accepted (compile and
    check_bounds: a recursive discriminated union is a real shape) and marked,
    so a refusal under it reports the verdict alone."""
    check_bounds(schema)
    assert compile(schema)._multiplies is not None


@pytest.mark.parametrize("applicator", ["anyOf", "allOf", "oneOf"])
def test_sch_33_a_refusal_under_multiplying_recursion_is_the_verdict_alone(
    applicator: str,
) -> None:
    """SCH-33: an invalid instance 60 levels deep under a doubling recursion
    (2**60 evaluations to collect its errors) is refused at once: ``validation``
    with no error entries and ``errors_withheld`` saying where the recursion
    multiplies; a valid one passes."""
    compiled = compile(_doubling(applicator))
    invalid_instance: Any = 1
    for _ in range(60):
        invalid_instance = {"x": invalid_instance}
    with pytest.raises(Error) as exc:
        compiled.validate(invalid_instance)
    details = refused(exc, ErrorClass.VALIDATION)
    assert details["errors"] == []
    assert details["error_count"] == 0
    assert details["errors_withheld"]["reason"] == "recursive_fanout"
    assert details["errors_withheld"]["path"].startswith("/$defs/n")
    assert compiled.validate({"y": 1}) == {"y": 1}  # "x" absent: nothing recurses


def _chain(length: int, *, back: str, to: str = "#/$defs/n0") -> dict[str, Any]:
    """``length`` schemas each applying the next in place (``allOf``) and
    recursing (to ``to``) through property ``c<i>``; the last one's
    property is ``back``."""
    defs: dict[str, Any] = {}
    for i in range(length):
        name = back if i == length - 1 else f"c{i}"
        link: dict[str, Any] = {"type": "object", "properties": {name: {"$ref": to}}}
        if i + 1 < length:
            link["allOf"] = [{"$ref": f"#/$defs/n{i + 1}"}]
        defs[f"n{i}"] = link
    return {"$ref": "#/$defs/n0", "$defs": defs}


@pytest.mark.parametrize("length", [2, 50, 3000])
def test_sch_33_a_long_in_place_chain_is_summarised_once(length: int) -> None:
    """SCH-33: a chain of in-place references whose links each recurse
    through their own property is linear in the instance and accepted; the
    same chain whose last link recurses through the first link's property
    multiplies, and is found however deep the chain (each link's summary is
    taken over by the link before it, not copied: 3,000 links preflight in
    about the time of their walk)."""
    assert compile(_chain(length, back="x"))._multiplies is None
    found = compile(_chain(length, back="c0"))._multiplies
    assert found is not None
    assert found[0] == "/$defs/n0"
    assert found[1:] == ("/c0", "recursive_fanout")


def test_sch_33_recursion_too_shared_to_analyse_withholds_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SCH-33: a summary several schemas share is copied by each that adds
    steps of its own; past ``_FANOUT_WORK`` copied steps the check stops and
    assumes the worst.  A
    refusal then reports the verdict alone, with the reason; a valid
    instance still passes."""
    cache_clear()
    monkeypatch.setattr(_preflight, "_FANOUT_WORK", 100)
    shared = _chain(20, back="x", to="#")
    schema = {
        "type": "object",
        "properties": {
            f"p{j}": {"properties": {"q": {"$ref": "#"}}, "allOf": [{"$ref": "#/$defs/n0"}]}
            for j in range(20)
        },
        "$defs": shared["$defs"],
    }
    compiled = compile(schema)
    assert compiled._multiplies is not None
    with pytest.raises(Error) as exc:
        compiled.validate({"p0": {"c3": 1}})
    details = refused(exc, ErrorClass.VALIDATION)
    assert details["errors"] == []
    assert details["errors_withheld"]["reason"] == "recursion_not_analysed"
    assert compiled.validate({"p0": {"c3": {}}}) == {"p0": {"c3": {}}}
    cache_clear()
    monkeypatch.setattr(_preflight, "_FANOUT_WORK", 10_000)
    assert compile(schema)._multiplies is None


def _annotating(levels: int, applicator: str) -> dict[str, Any]:
    """``levels`` nested ``applicator`` branches, each level holding
    ``unevaluatedProperties``: the engine evaluates every level's branches
    again to collect their annotations."""
    schema: dict[str, Any] = {"unevaluatedProperties": False}
    for i in range(levels):
        branch = {"properties": {f"p{i}": True}}
        if applicator == "if":
            schema = {"if": schema, "then": branch, "unevaluatedProperties": False}
        else:
            schema = {applicator: [schema, branch], "unevaluatedProperties": False}
    return schema


def _annotating_by_ref(levels: int, applicator: str) -> dict[str, Any]:
    """:func:`_annotating`'s nesting written as ``$defs`` levels, each
    applying the one below through a ``$ref``."""
    defs: dict[str, Any] = {"l0": {"unevaluatedProperties": False}}
    for i in range(1, levels + 1):
        below = {"$ref": f"#/$defs/l{i - 1}"}
        branch = {"properties": {f"p{i}": True}}
        if applicator == "if":
            defs[f"l{i}"] = {"if": below, "then": branch, "unevaluatedProperties": False}
        else:
            defs[f"l{i}"] = {applicator: [below, branch], "unevaluatedProperties": False}
    return {"$ref": f"#/$defs/l{levels}", "$defs": defs}


@pytest.mark.parametrize("applicator", ["anyOf", "oneOf", "if"])
def test_sch_33_annotation_fanout_fails_closed(applicator: str) -> None:
    """SCH-33: levels of branching applicators under ``unevaluated*`` double
    the engine's work per level (22 levels of a 1.5 KB schema took 10 s a
    call), written inline or through ``$ref``s.  Such a schema is refused
    with ``execution_failure`` (reason ``annotation_fanout``) at compile and
    by ``check_bounds``, long before that; a few levels (real schemas)
    compile and validate as before."""
    for deep in (_annotating(30, applicator), _annotating_by_ref(30, applicator)):
        for build in (compile, check_bounds):
            with pytest.raises(Error) as exc:
                build(deep)
            assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "annotation_fanout"
    shallow = compile(_annotating(4, applicator))
    instance: dict[str, Any] = {"p3": 1} if applicator != "if" else {}
    assert shallow.validate(instance) == instance
    with pytest.raises(Error):
        shallow.validate({"zz": 1})  # still unevaluated: refused


@pytest.mark.parametrize("wrapper", ["allOf", "dependentSchemas", "not"])
def test_sch_33_annotation_fanout_through_a_wrapper_fails_closed(wrapper: str) -> None:
    """SCH-33: a branch under ``unevaluated*`` wrapped in an in-place keyword
    that does not branch (``allOf``, ``dependentSchemas``, ``not``) is still
    evaluated at the holder's instance location: it doubles as the direct
    form does (13 levels of ``allOf`` took 1.9 s a call, 3x a level)."""

    def wrapped(inner: dict[str, Any]) -> Any:
        if wrapper == "allOf":
            return [inner]
        if wrapper == "dependentSchemas":
            return {"p": inner}
        return inner  # "not": the branch itself

    schema: dict[str, Any] = {"unevaluatedProperties": False}
    for i in range(14):
        branch = {"anyOf": [schema, {"properties": {f"p{i}": True}}]}
        schema = {"unevaluatedProperties": False, wrapper: wrapped(branch)}
    for build in (compile, check_bounds):
        with pytest.raises(Error) as exc:
            build(schema)
        assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "annotation_fanout"


def test_sch_33_recursion_linear_in_the_instance_is_accepted() -> None:
    """SCH-33: recursion whose paths take different instance steps (a binary
    tree, a JSON value, a linked list, a UI component tree, a map with named
    children) is accepted and validates as before."""
    tree = {
        "type": "object",
        "properties": {"left": {"$ref": "#"}, "right": {"allOf": [{"$ref": "#"}]}},
    }
    value = {
        "$defs": {
            "v": {
                "anyOf": [
                    {"type": ["null", "boolean", "number", "string"]},
                    {"type": "array", "items": {"$ref": "#/$defs/v"}},
                    {"type": "object", "additionalProperties": {"$ref": "#/$defs/v"}},
                ]
            }
        },
        "$ref": "#/$defs/v",
    }
    linked = {
        "type": "object",
        "properties": {"value": {}, "next": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}},
        "required": ["value"],
    }
    ui = {
        "$defs": {
            "c": {
                "type": "object",
                "properties": {
                    "type": {"enum": ["row", "text"]},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/c"}},
                },
                "required": ["type"],
            }
        },
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/c"}},
    }
    dynamic = {
        "$dynamicAnchor": "node",
        "properties": {"children": {"type": "array", "items": {"$dynamicRef": "#node"}}},
    }
    named_map = {
        "type": "object",
        "properties": {"a": {"$ref": "#"}},
        "additionalProperties": {"$ref": "#"},
    }
    deep: Any = {"value": 1, "next": None}
    for _ in range(100):
        deep = {"value": 1, "next": deep}
    cases: list[tuple[dict[str, Any], Any, bool]] = [
        (tree, {"left": {"right": {"left": {}}}}, True),
        (tree, {"left": {"right": {"left": 1}}}, False),
        (value, {"a": [1, {"b": [None, "x"]}]}, True),
        (linked, deep, True),
        (linked, {"value": 1, "next": {"next": None}}, False),
        (ui, {"root": {"type": "row", "children": [{"type": "text"}]}}, True),
        (ui, {"root": {"type": "row", "children": [{"type": "img"}]}}, False),
        (dynamic, {"children": [{"children": []}]}, True),
        (dynamic, {"children": [{"children": 1}]}, False),
        (named_map, {"a": {"b": {"a": {}}}}, True),
        (named_map, {"a": {"b": 1}}, False),
    ]
    for schema, instance, valid in cases:
        check_bounds(schema)
        assert (compile(schema).errors(instance) == []) is valid, (schema, instance)


def test_sch_34_limits_per_call() -> None:
    """SCH-34: any Limits field is configurable per call and reported as maximum."""
    tight = attrs.evolve(Limits(), max_input_depth=3, max_subschemas=5, max_pattern_bytes=4)
    with pytest.raises(Error) as exc:
        validate({}, {"a": [[[1]]]}, limits=tight)
    validate({}, {"a": [[1]]}, limits=tight)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["maximum"] == 3
    with pytest.raises(Error) as exc:
        validate_schema({"properties": {str(i): {} for i in range(5)}}, limits=tight)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["maximum"] == 5
    with pytest.raises(Error) as exc:
        validate_schema({"properties": {"s": {"pattern": "abcde"}}}, limits=tight)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["maximum"] == 4
    with pytest.raises(Error):
        Limits(max_input_depth=0)
    assert Limits() == Limits.host()
    assert attrs.astuple(Limits.host()) == (
        128,
        128,
        100_000,
        1_048_576,
        10_000,
        1_024,
        128,
        1_048_576,
    )
    assert attrs.astuple(Limits.mcp()) == (64, 32, 1_000, 262_144, 10_000, 1_024, 128, 1_048_576)


def test_sch_35_no_recursion_error() -> None:
    """SCH-35: 100 000 levels or a self-containing dict give a classed Error."""
    deep_schema: dict[str, Any] = {}
    for _ in range(100_000):
        deep_schema = {"not": deep_schema}
    with pytest.raises(Error) as exc:
        validate_schema({"properties": {"a": deep_schema}})
    refused(exc, ErrorClass.EXECUTION_FAILURE)
    with pytest.raises(Error):
        check_bounds(deep_schema)
    loop: dict[str, Any] = {}
    loop["not"] = loop
    with pytest.raises(Error) as exc:
        validate_schema(loop)
    refused(exc, ErrorClass.EXECUTION_FAILURE)
    arguments: dict[str, Any] = {}
    arguments["self"] = arguments
    with pytest.raises(Error) as exc:
        validate({}, arguments)
    refused(exc, ErrorClass.EXECUTION_FAILURE)
    with pytest.raises(Error):
        validate({}, {"a": _deep_list(100_000)})


# -- check_bounds (spec 003) ------------------------------------------------------


@pytest.mark.parametrize("ok", [{"type": "object"}, True, False])
def test_sch_36_check_bounds_accepts(ok: Any) -> None:
    """SCH-36: check_bounds returns None for an object schema and booleans."""
    assert check_bounds(ok) is None


@pytest.mark.parametrize("bad", [None, [], "schema", 3, 1.5])
def test_sch_36_check_bounds_invalid_schema(bad: Any) -> None:
    """SCH-36: anything else is validation invalid_schema."""
    with pytest.raises(Error) as exc:
        check_bounds(bad)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "invalid_schema"


def _json_depth_schema(levels: int) -> dict[str, Any]:
    """A schema whose JSON nesting is exactly ``levels`` (a nested examples value)."""
    value: Any = []
    for _ in range(levels - 2):
        value = [value]
    return {"examples": value}


def test_sch_37_mcp_depths() -> None:
    """SCH-37: more than 64 JSON levels or 32 subschema levels are too_deep; exactly pass."""
    check_bounds(_json_depth_schema(64))
    with pytest.raises(Error) as exc:
        check_bounds(_json_depth_schema(65))
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "too_deep"
    check_bounds(nested(32))
    with pytest.raises(Error) as exc:
        check_bounds(nested(33))
    details = refused(exc, ErrorClass.EXECUTION_FAILURE)
    assert details["reason"] == "too_deep"
    assert details["limit"] == "max_subschema_depth"


def test_sch_38_mcp_subschema_count() -> None:
    """SCH-38: more than 1 000 subschemas are too_many_subschemas; exactly 1 000 pass."""
    check_bounds({"properties": {str(i): {} for i in range(999)}})
    with pytest.raises(Error) as exc:
        check_bounds({"properties": {str(i): {} for i in range(1000)}})
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "too_many_subschemas"
    # values inside enum, const, default, examples and unknown keywords do not count
    check_bounds(
        {
            "properties": {str(i): {} for i in range(999)},
            "enum": [{}] * 5000,
            "x-extra": {"properties": {str(i): {} for i in range(5000)}},
        }
    )


def test_sch_39_mcp_size() -> None:
    """SCH-39: over 262 144 encoded bytes is too_large; exactly 262 144 pass."""
    overhead = len('{"description":""}')
    check_bounds({"description": "x" * (262_144 - overhead)})
    with pytest.raises(Error) as exc:
        check_bounds({"description": "x" * (262_144 - overhead + 1)})
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "too_large"
    # UTF-8 bytes, not characters
    with pytest.raises(Error):
        check_bounds({"description": "\u00e9" * ((262_144 - overhead) // 2 + 1)})


@pytest.mark.parametrize(
    "ref", ["http://169.254.169.254/", "file:other.json", "other.json", "https://a.test/x#/y"]
)
def test_sch_40_remote_refs(ref: str, no_io: list[str]) -> None:
    """SCH-40: with allow_external_refs=False any non-'#' reference is remote_ref."""
    for key in ("$ref", "$dynamicRef"):
        with pytest.raises(Error) as exc:
            check_bounds({"properties": {"a": {key: ref}}})
        assert refused(exc, ErrorClass.VALIDATION)["reason"] == "remote_ref"
        with pytest.raises(Error) as exc:
            validate_schema({"properties": {"a": {key: ref}}}, allow_external_refs=False)
        assert refused(exc, ErrorClass.VALIDATION)["reason"] == "remote_ref"
    check_bounds({"$defs": {"a": {}}, "$ref": "#/$defs/a"})
    assert no_io == []


# -- composition, suite, fixtures (see test_fixtures.py / conformance/) ----------


ONE_OF_BRANCHES = [
    {"properties": {"kind": {"const": "a"}, "n": {"type": "integer"}}, "required": ["kind"]},
    {"properties": {"kind": {"const": "b"}, "s": {"type": "string"}}, "required": ["kind", "s"]},
]


@pytest.mark.parametrize("where", ["root", "property", "items"])
def test_sch_41_one_of_beside_object_keywords(where: str) -> None:
    """SCH-41: siblings hold and exactly one oneOf branch matches (issue #45 form)."""
    form = {
        "type": "object",
        "properties": {"id": {"type": "string"}},
        "required": ["id"],
        "oneOf": ONE_OF_BRANCHES,
    }

    def wrap(value: Any) -> Any:
        if where == "root":
            return value
        if where == "property":
            return {"p": value}
        return {"p": [value]}

    if where == "root":
        schema: dict[str, Any] = form
    elif where == "property":
        schema = {"properties": {"p": form}}
    else:
        schema = {"properties": {"p": {"type": "array", "items": form}}}
    validate(schema, wrap({"id": "1", "kind": "a", "n": 1}))
    validate(schema, wrap({"id": "1", "kind": "b", "s": "x"}))
    for bad in (
        {"kind": "a"},
        {"id": "1", "kind": "c"},
        {"id": "1", "kind": "b"},
        {"id": 1, "kind": "a"},
    ):
        with pytest.raises(Error) as exc:
            validate(schema, wrap(bad))
        refused(exc, ErrorClass.VALIDATION)


# -- cache and fingerprints ----------------------------------------------------------


def test_sch_46_fingerprints() -> None:
    """SCH-46: equal JSON (key order aside) shares a fingerprint; every option splits it."""
    a = {"type": "object", "properties": {"x": {"type": "string"}, "y": {}}}
    b = {"properties": {"y": {}, "x": {"type": "string"}}, "type": "object"}
    assert compile(a).fingerprint == compile(b).fingerprint
    assert (
        compile({"properties": {"c": {"const": True}}}).fingerprint
        != compile({"properties": {"c": {"const": 1}}}).fingerprint
    )
    base = compile(a).fingerprint
    variants = [
        {"format_assertion": True},
        {"content_assertion": True},
        {"dialects": {"2020-12", "draft-07"}},
        {"schema_registry": {"https://example.test/x": {}}},
        {"limits": attrs.evolve(Limits(), max_input_bytes=10)},
        {"allow_external_refs": False},
    ]
    prints = {compile(a, **v).fingerprint for v in variants}  # type: ignore[arg-type]
    assert base not in prints
    assert len(prints) == len(variants)
    assert compile(a).fingerprint != compile_output(a).fingerprint


def test_sch_46_cache_compiles_once_and_caches_refusals() -> None:
    """SCH-46: repeated validate compiles once; refusals are cached, loader ones never."""
    cache_clear()
    schema = {"properties": {"n": {"type": "integer"}}}
    for i in range(5):
        validate(copy.deepcopy(schema), {"n": i})
    info = cache_info()
    assert (info["misses"], info["hits"]) == (1, 4)
    bad = {"$schema": D07}
    for _ in range(3):
        with pytest.raises(Error):
            validate_schema(bad)
    info = cache_info()
    assert (info["misses"], info["hits"]) == (2, 6)
    calls: list[str] = []

    def loader(uri: str) -> Any:
        calls.append(uri)
        raise OSError("down")

    for _ in range(2):
        with pytest.raises(Error):
            validate_schema({"$ref": "https://example.test/x"}, schema_loader=loader)
    assert len(calls) == 2  # the refusal was not cached


@pytest.mark.parametrize(
    "entry",
    [
        {"enum": ("x", "y")},
        {"anyOf": ({"const": "x"},)},
        {"properties": {"q": {"enum": ("x",)}}},
    ],
)
def test_sch_46_non_json_registry_never_shares_a_cache_entry(entry: dict[str, Any]) -> None:
    """SCH-46: a registry that is not JSON data (a tuple encodes like a list)
    never caches a result under the key of the JSON registry it resembles."""
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.test/e"}}}
    bad = {"https://example.test/e": entry}
    good = {"https://example.test/e": json.loads(json.dumps(entry))}
    for first, second in ((bad, good), (good, bad)):
        cache_clear()
        for registry in (first, second):
            if registry is bad:
                with pytest.raises(Error) as exc:
                    validate(schema, {"a": "x"}, schema_registry=registry)
                assert refused(exc, ErrorClass.VALIDATION)["reason"] == "not_json"
            else:
                assert validate(schema, {"a": "x"}, schema_registry=registry) == {"a": "x"}


def test_sch_46_cache_is_bounded() -> None:
    """SCH-46: the cache holds at most 4 096 entries."""
    cache_clear()
    for i in range(4100):
        validate_schema({"properties": {"n": {"maximum": i}}})
    assert cache_info()["size"] == 4096


def test_sch_47_output_schemas() -> None:
    """SCH-47: any root and any JSON value for output schemas."""
    for schema, value in [
        (True, [1, 2]),
        ({"type": "array", "items": {"type": "integer"}}, [1, 2]),
        ({}, "text"),
        ({"type": "string"}, "text"),
    ]:
        assert validate_output(schema, value) is value
    with pytest.raises(Error) as exc:
        validate_output({"type": "array"}, {"a": 1})
    assert refused(exc, ErrorClass.VALIDATION)["errors"]
    with pytest.raises(Error):
        validate_output(False, None)


def test_sch_48_draft_07_opt_in() -> None:
    """SCH-48: draft-07 only with dialects=, and evaluated as draft-07."""
    schema = {
        "$schema": D07,
        "type": "object",
        "definitions": {"n": {"type": "integer"}},
        "properties": {
            "pair": {"items": [{"type": "string"}, {"$ref": "#/definitions/n"}]},
            "a": {},
        },
        "dependencies": {"a": ["b"]},
    }
    with pytest.raises(Error) as exc:
        validate_schema(schema)
    refused(exc, ErrorClass.UNSUPPORTED_CAPABILITY)
    both = {"2020-12", "draft-07"}
    validate(schema, {"pair": ["x", 1]}, dialects=both)
    with pytest.raises(Error):  # array items keep their draft-07 tuple meaning
        validate(schema, {"pair": ["x", "y"]}, dialects=both)
    with pytest.raises(Error):  # dependencies keep their draft-07 meaning
        validate(schema, {"a": 1}, dialects=both)
    # without $schema a schema is still 2020-12 (array items is a meta-schema error)
    with pytest.raises(Error):
        validate_schema({"properties": {"p": {"items": [{}]}}}, dialects=both)
    with pytest.raises(Error):
        validate_schema({}, dialects={"draft-04"})
    assert SchemaOptions(dialects=["2020-12", "draft-07"]).dialects == frozenset(both)


def test_sch_49_integers_beyond_the_engine() -> None:
    """SCH-49: an integer over 4 300 digits is execution_failure integer_too_large."""
    schema = {"properties": {"n": {"maximum": 5}}}
    for n in (10**4300, -(10**4300), 10**5000):
        with pytest.raises(Error) as exc:
            validate(schema, {"n": n})
        details = refused(exc, ErrorClass.EXECUTION_FAILURE)
        assert details["reason"] == "integer_too_large"
        assert details["maximum"] == 4300
        assert "limit" not in details
    with pytest.raises(Error):
        validate(schema, {"n": 10**4300 - 1})  # 4300 digits: compared faithfully, > 5


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
        {"allOf": [{"$ref": "#"}]},
        {"$dynamicAnchor": "x", "$dynamicRef": "#x"},
        {"properties": {"p": {"$ref": "#/properties/p"}}},
        {"$defs": {"a": {"not": {"anyOf": [{"$ref": "#/$defs/a"}]}}}},
    ],
)
def test_sch_50_non_progressing_cycles(schema: dict[str, Any]) -> None:
    """SCH-50: reference cycles that consume no input raise validation ref_cycle."""
    with pytest.raises(Error) as exc:
        validate_schema(schema)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "ref_cycle"


def test_sch_50_descending_recursion_is_fine() -> None:
    """SCH-50: recursion that descends into the instance validates trees."""
    tree = {
        "properties": {"value": {"type": "integer"}, "child": {"$ref": "#"}},
        "required": ["value"],
    }
    validate(tree, {"value": 1, "child": {"value": 2, "child": {"value": 3}}})
    with pytest.raises(Error):
        validate(tree, {"value": 1, "child": {"child": {"value": 3}}})


# -- reference targets that no subschema position reaches ------------------------------

D04 = "http://json-schema.org/draft-04/schema#"


def hidden(target: Any, where: str) -> dict[str, Any]:
    """A schema whose property ``a`` refers to ``target``, placed where preflight's
    walk of subschema positions never goes: an unknown keyword or an enum value."""
    if where == "x-foo":
        return {"type": "object", "properties": {"a": {"$ref": "#/x-foo"}}, "x-foo": target}
    return {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/e/enum/0"}},
        "$defs": {"e": {"enum": [target]}},
    }


HIDDEN_POINTER = {"x-foo": "#/x-foo", "enum": "#/$defs/e/enum/0"}


@pytest.mark.parametrize("where", ["x-foo", "enum"])
@pytest.mark.parametrize(
    ("target", "cls", "reason"),
    [
        ({"type": "string", "pattern": "(?i)^abc$"}, ErrorClass.VALIDATION, "invalid_pattern"),
        ({"pattern": "a" * 5000}, ErrorClass.EXECUTION_FAILURE, "pattern_too_long"),
        ({"$schema": D04, "type": "string"}, ErrorClass.UNSUPPORTED_CAPABILITY, None),
        ({"$ref": "#/$defs/missing"}, ErrorClass.VALIDATION, "unresolved"),
        ({"anyOf": [{}] * 200}, ErrorClass.EXECUTION_FAILURE, "too_many_subschemas"),
        ({"$id": "https://e.test/x", "type": "string"}, ErrorClass.VALIDATION, "hidden_resource"),
        ({"$anchor": "n", "type": "string"}, ErrorClass.VALIDATION, "hidden_resource"),
        (5, ErrorClass.VALIDATION, "invalid_schema"),
    ],
)
def test_sch_24_reference_targets_outside_subschema_positions_are_preflighted(
    where: str, target: Any, cls: ErrorClass, reason: str | None
) -> None:
    """SCH-24/27/28/03/21/33: a $ref into an unknown keyword or an enum value is
    walked as a subschema with every check, counted toward the same bounds."""
    with pytest.raises(Error) as exc:
        validate_schema(hidden(target, where), limits=Limits(max_subschemas=200))
    details = refused(exc, cls)
    if reason is not None:
        assert details["reason"] == reason


@pytest.mark.parametrize("where", ["x-foo", "enum"])
def test_sch_50_cycle_through_a_hidden_reference_target(where: str) -> None:
    """SCH-50: a cycle through a location outside subschema positions is ref_cycle."""
    for target in (
        {"$ref": HIDDEN_POINTER[where]},
        {"allOf": [{"$ref": HIDDEN_POINTER[where]}], "type": "string"},
    ):
        with pytest.raises(Error) as exc:
            validate_schema(hidden(target, where))
        assert refused(exc, ErrorClass.VALIDATION)["reason"] == "ref_cycle"


@pytest.mark.parametrize("where", ["x-foo", "enum"])
def test_sch_40_remote_ref_behind_a_hidden_reference_target(where: str, no_io: list[str]) -> None:
    """SCH-40: check_bounds and allow_external_refs=False follow local references
    into unknown keywords and enum values; so do its bounds (SCH-38)."""
    schema = hidden({"$ref": "http://169.254.169.254/"}, where)
    with pytest.raises(Error) as exc:
        check_bounds(schema)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "remote_ref"
    with pytest.raises(Error) as exc:
        validate_schema(schema, allow_external_refs=False)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "remote_ref"
    with pytest.raises(Error) as exc:
        check_bounds(hidden({"anyOf": [{}] * 1000}, where))
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "too_many_subschemas"
    check_bounds(hidden({"anyOf": [{}] * 10}, where))
    assert no_io == []


@pytest.mark.parametrize("where", ["x-foo", "enum"])
def test_sch_24_valid_hidden_reference_target_still_applies(where: str) -> None:
    """SCH-24: a well-formed target outside subschema positions is accepted and bites."""
    schema = hidden({"type": "string", "pattern": "^a"}, where)
    validate(schema, {"a": "abc"})
    with pytest.raises(Error) as exc:
        validate(schema, {"a": "b"})
    assert "errors" in refused(exc, ErrorClass.VALIDATION)


# -- legacy keywords the engine honours in a 2020-12 schema ---------------------------


@pytest.mark.parametrize("legacy", ["dependencies", "definitions"])
@pytest.mark.parametrize(
    ("sub", "cls", "reason"),
    [
        ({"pattern": "(?i)^abc$"}, ErrorClass.VALIDATION, "invalid_pattern"),
        ({"pattern": "a" * 4000}, ErrorClass.EXECUTION_FAILURE, "pattern_too_long"),
        ({"$schema": D04}, ErrorClass.UNSUPPORTED_CAPABILITY, None),
        ({"$ref": "#/$defs/missing"}, ErrorClass.VALIDATION, "unresolved"),
    ],
)
def test_sch_24_legacy_keywords_the_engine_honours_are_preflighted(
    legacy: str, sub: dict[str, Any], cls: ErrorClass, reason: str | None
) -> None:
    """SCH-24/27/28/03/21: in 2020-12 the engine still applies `dependencies`
    and registers resources in `definitions`, so both are subschema positions."""
    with pytest.raises(Error) as exc:
        validate_schema({"type": "object", legacy: {"k": {"properties": {"s": sub}}}})
    details = refused(exc, cls)
    if reason is not None:
        assert details["reason"] == reason


def test_sch_50_cycle_through_legacy_dependencies() -> None:
    """SCH-50: `dependencies` applies in place, so a $ref back to it is a cycle."""
    with pytest.raises(Error) as exc:
        validate_schema({"type": "object", "dependencies": {"k": {"$ref": "#"}}})
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "ref_cycle"


@pytest.mark.parametrize("legacy", ["dependencies", "definitions"])
def test_sch_38_40_check_bounds_walks_legacy_keywords(legacy: str, no_io: list[str]) -> None:
    """SCH-38/SCH-40: check_bounds counts and checks 2020-12 legacy keywords."""
    with pytest.raises(Error) as exc:
        check_bounds({"type": "object", legacy: {"k": {"$ref": "http://169.254.169.254/"}}})
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "remote_ref"
    many = {"type": "object", legacy: {f"k{i}": {"type": "string"} for i in range(1000)}}
    with pytest.raises(Error) as exc:
        check_bounds(many)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "too_many_subschemas"
    assert no_io == []


def test_sch_24_legacy_keywords_keep_their_engine_meaning() -> None:
    """Both `dependencies` forms still apply (the suite's optional
    dependencies-compatibility), and an $id in `definitions` resolves."""
    schema = {
        "type": "object",
        "dependencies": {"a": ["b"], "c": {"required": ["d"]}},
        "properties": {"e": {"$ref": "https://example.test/d"}},
        "definitions": {"d": {"$id": "https://example.test/d", "type": "string"}},
    }
    validate(schema, {"a": 1, "b": 2, "c": 3, "d": 4, "e": "x"})
    for arguments in ({"a": 1}, {"c": 1}, {"e": 1}):
        with pytest.raises(Error) as exc:
            validate(schema, arguments)
        assert "errors" in refused(exc, ErrorClass.VALIDATION)


# -- check_bounds and draft-07 (MCP servers often send draft-07) ----------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": D07, "definitions": {"a": {"$ref": "http://169.254.169.254/"}}},
        {"$schema": D07, "dependencies": {"a": {"$ref": "file:///etc/passwd"}}},
        {"$schema": D07, "type": "array", "items": [{"$ref": "other.json"}]},
        {"$schema": D07, "type": "array", "additionalItems": {"$ref": "other.json"}},
        {"$schema": D07, "properties": {"p": {"items": [{}, {"$ref": "other.json"}]}}},
    ],
)
def test_sch_40_check_bounds_walks_draft_07_positions(
    schema: dict[str, Any], no_io: list[str]
) -> None:
    """SCH-40/MCP-04: check_bounds walks a draft-07 schema with draft-07 positions."""
    with pytest.raises(Error) as exc:
        check_bounds(schema)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "remote_ref"
    assert no_io == []


def test_sch_37_38_check_bounds_counts_draft_07_positions() -> None:
    """SCH-37/SCH-38: draft-07 array items and additionalItems count, and
    exactly 1 000 subschemas and 32 levels still pass."""
    items = {"$schema": D07, "type": "array", "items": [{}] * 998, "additionalItems": {}}
    check_bounds(items)  # root + 998 + 1
    with pytest.raises(Error) as exc:
        check_bounds({**items, "items": [{}] * 999})
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "too_many_subschemas"
    deep: dict[str, Any] = {}
    for _ in range(31):
        deep = {"items": [deep]}
    roomy = attrs.evolve(Limits.mcp(), max_json_depth=128)  # only subschemas bite
    check_bounds({"$schema": D07, **deep}, roomy)  # 32 subschema levels
    with pytest.raises(Error) as exc:
        check_bounds({"$schema": D07, "items": [deep]}, roomy)
    details = refused(exc, ErrorClass.EXECUTION_FAILURE)
    assert (details["reason"], details["limit"]) == ("too_deep", "max_subschema_depth")


# -- options and limits are checked where they are built ------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schema_registry": 5}, "schema_registry must be a mapping of URI to schema"),
        ({"schema_loader": "not callable"}, "schema_loader must be callable"),
        ({"format_assertion": 1}, "format_assertion must be a bool"),
        ({"content_assertion": "yes"}, "content_assertion must be a bool"),
        ({"allow_external_refs": None}, "allow_external_refs must be a bool"),
        ({"limits": {"max_refs": 5}}, "limits must be a Limits or None"),
        ({"dialects": "2020-12"}, "dialects must be a collection of dialect names"),
        (
            {"schema_registry": {}, "schema_loader": lambda uri: {}},
            "pass either schema_registry or schema_loader, not both",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_schema_options_are_validation_errors(kwargs: dict[str, Any], message: str) -> None:
    """A bad option is refused when the options are built, for SchemaOptions
    and compile() alike, with a message naming the option."""
    for build in (lambda: SchemaOptions(**kwargs), lambda: compile({}, **kwargs)):
        with pytest.raises(Error) as exc:
            build()
        refused(exc, ErrorClass.VALIDATION)
        assert exc.value.message == message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_refs": 0}, "max_refs must be a positive int"),
        ({"max_schema_bytes": 1.5}, "max_schema_bytes must be a positive int"),
        ({"max_subschemas": True}, "max_subschemas must be a positive int"),
        ({"max_json_depth": 257}, "max_json_depth must be at most 256"),
        ({"max_input_depth": 257}, "max_input_depth must be at most 256"),
        ({"max_subschema_depth": 10_001}, "max_subschema_depth must be at most 256"),
    ],
)
def test_bad_limits_are_validation_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(Error) as exc:
        Limits(**kwargs)
    details = refused(exc, ErrorClass.VALIDATION)
    assert exc.value.message == message
    assert details["option"] == next(iter(kwargs))
    assert Limits(max_json_depth=256).max_json_depth == 256


def test_schema_options_as_kwargs_compile_the_same_schema() -> None:
    """``SchemaOptions.as_kwargs()`` gives compile() the same options: the
    same fingerprint as passing them one by one."""
    options = SchemaOptions(format_assertion=True, limits=Limits.mcp(), allow_external_refs=False)
    schema = {"properties": {"e": {"format": "email"}}}
    assert (
        compile(schema, **options.as_kwargs()).fingerprint
        == compile(
            schema, format_assertion=True, limits=Limits.mcp(), allow_external_refs=False
        ).fingerprint
    )
    assert compile(schema, **options.as_kwargs()).fingerprint != compile(schema).fingerprint


def test_compiled_schema_errors_lists_entries_or_nothing() -> None:
    """``CompiledSchema.errors`` returns the error entries ``validate`` would
    raise with, and an empty list for valid arguments; a failure that is not
    a mismatch (arguments that are not JSON data) is raised, not listed."""
    compiled = compile({"properties": {"n": {"type": "integer", "maximum": 3}}, "required": ["n"]})
    assert compiled.errors({"n": 2}) == []
    entries = compiled.errors({"n": 7})
    assert [e["keyword"] for e in entries] == ["maximum"]
    assert set(entries[0]) >= {"instance_path", "schema_path", "keyword", "message"}
    assert {e["keyword"] for e in compiled.errors({})} == {"required"}
    with pytest.raises(Error):
        compiled.errors({"n": math.nan})


# -- the recursive fan-out check against a plain reference ------------------------


def _reference_multiplies(result: _preflight.Preflight) -> str | None:
    """Where the recursive fan-out check finds a schema multiplying, computed
    the plain way: every summary a new frozen set, the union of its sources'."""
    graph = result.graph
    component = _recursion.components(graph)
    summary: dict[Any, frozenset[Any]] = {}
    try:
        for start in component:
            if start in summary:
                continue
            summary[start] = frozenset()
            stack = [(start, _recursion.sources(graph, start, component))]
            while stack:
                loc, sources = stack[-1]
                pending = next((s for g in sources for s in g if s not in summary), None)
                if pending is not None:
                    summary[pending] = frozenset()
                    stack.append((pending, _recursion.sources(graph, pending, component)))
                    continue
                stack.pop()
                joined = _recursion.local_steps(graph, loc, component)
                for group in sources:
                    steps = frozenset().union(*(summary[s] for s in group))
                    if _recursion.clash(joined, steps) is not None:
                        return json_pointer(loc[1])
                    joined |= steps
                summary[loc] = joined
    except _recursion.Multiplies as found:
        return found.where
    return None


_REF = st.integers(0, 4).map(lambda k: {"$ref": f"#/$defs/d{k}"}) | st.just({"$ref": "#"})
_LINK = st.fixed_dictionaries(
    {},
    optional={
        "properties": st.dictionaries(st.sampled_from("ab"), _REF, max_size=2),
        "allOf": st.lists(_REF, min_size=1, max_size=2),
        "anyOf": st.lists(_REF, min_size=1, max_size=2),
        "items": _REF,
        "additionalProperties": _REF,
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINK, min_size=5, max_size=5), _REF)
def test_sch_33_the_fanout_check_agrees_with_the_plain_reference(
    links: list[dict[str, Any]], root: dict[str, Any]
) -> None:
    """SCH-33: taking summaries over and borrowing them, rather than
    building each anew, finds multiplying recursion exactly where the plain
    computation does (and nowhere else), on random graphs of references."""
    schema = {**root, "$defs": {f"d{k}": link for k, link in enumerate(links)}}
    try:
        result = _preflight.preflight(
            schema,
            limits=Limits.host(),
            dialects=normalize_dialects(SchemaOptions().dialects),
            registry=None,
            loader=None,
            allow_external_refs=False,
        )
    except Error:
        assume(False)  # a cycle consuming no input: refused before the check
        raise
    found = None if result.multiplies is None else result.multiplies[0]
    assert found == _reference_multiplies(result)


@pytest.mark.parametrize(
    "schema",
    [
        # a decoy anchor beside a reference cycle: the engine took the cycle
        {
            "properties": {"p": {"$ref": "#x"}},
            "$defs": {
                "decoy": {"$anchor": "x", "type": "string"},
                "real": {"$anchor": "x", "$ref": "#x"},
            },
        },
        {
            "$defs": {
                "a": {"$id": "https://ex.test/x", "type": "string"},
                "b": {"$id": "HTTPS://ex.test:443/x", "minimum": 1},
            }
        },
        {"$defs": {"a": {"$dynamicAnchor": "n"}, "b": {"$anchor": "n"}}},
    ],
)
def test_sch_50_sch_33_an_identifier_declared_twice_is_refused(schema: dict[str, Any]) -> None:
    """SCH-50, SCH-33: two schemas declaring one identifier (an anchor, a
    resource ``$id``, equal as the engine compares URIs) are refused: the
    checks would analyse one and the engine evaluate the other, which hid a
    reference cycle (every instance accepted) or a fan-out from every bound."""
    with pytest.raises(Error) as exc:
        validate_schema(schema)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "duplicate_identifier"


def test_sch_50_one_identifier_in_two_resources_is_two_identifiers() -> None:
    """The same anchor name in two resources (two ``$id``) is two anchors."""
    schema = {
        "$defs": {
            "a": {"$id": "https://ex.test/a", "$anchor": "n", "type": "string"},
            "b": {"$id": "https://ex.test/b", "$anchor": "n", "type": "integer"},
        },
        "properties": {"p": {"$ref": "https://ex.test/b#n"}},
    }
    assert validate(schema, {"p": 1}) == {"p": 1}
    with pytest.raises(Error):
        validate(schema, {"p": "s"})


@pytest.mark.parametrize(
    ("sub", "text", "reason"),
    [
        ({"contentMediaType": "application/json"}, "[" * 200 + "]" * 200, "input_too_deep"),
        (
            {"contentMediaType": "application/json", "contentSchema": {"type": "array"}},
            "[" * 200 + "]" * 200,
            "input_too_deep",
        ),
        (
            {"contentMediaType": "application/json", "contentSchema": {"maximum": 5}},
            "-" + "9" * 5000,
            "integer_too_large",
        ),
    ],
)
def test_sch_30_a_limit_inside_content_is_never_a_pass(sub: Any, text: str, reason: str) -> None:
    """SCH-30, SCH-14: with ``content_assertion``, a limit hit inside decoded
    content (too deep, too many digits) raises execution_failure whatever
    the verdict: under ``not`` or ``oneOf`` it used to count as a mismatch,
    and so as a pass."""
    for wrap in (lambda c: {"not": c}, lambda c: {"oneOf": [c, {"type": "string"}]}, lambda c: c):
        schema = {"type": "object", "properties": {"p": wrap(sub)}}
        with pytest.raises(Error) as exc:
            validate(schema, {"p": text}, content_assertion=True)
        assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == reason


_CYCLE_BEHIND_A_DECOY: dict[str, Any] = {
    "type": "object",
    "properties": {"amount": {"$ref": "#/$defs/amount"}},
    "required": ["amount"],
    "$defs": {
        "amount": {"$ref": "#/$defs/amount"},  # consumes no input: SCH-50
        "decoy": {"$defs": {"amount": {"type": "integer", "maximum": 100}}},
    },
}


@pytest.mark.parametrize("ident", ["", "#", "/", "json-schema:///", "JSON-SCHEMA:///"])
@pytest.mark.parametrize("local_only", [False, True])
def test_sch_50_a_subschema_claiming_the_root_uri_is_refused(ident: str, local_only: bool) -> None:
    """SCH-50, SCH-33: a subschema whose ``$id`` resolves to the root's own
    URI (a root without ``$id`` is ``json-schema:///``) would have the checks
    follow the root's references into it while the engine follows them in
    the root, hiding a reference cycle (every instance was accepted): the
    identifier is refused as declared twice, with default options and
    with local references only (the MCP setting)."""
    schema = copy.deepcopy(_CYCLE_BEHIND_A_DECOY)
    schema["$defs"]["decoy"]["$id"] = ident
    options = {"allow_external_refs": False} if local_only else {}
    cache_clear()
    with pytest.raises(Error) as exc:
        validate(schema, {"amount": "not a number at all"}, **options)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "duplicate_identifier"


def test_sch_48_sch_50_draft_07_ignores_an_id_beside_ref() -> None:
    """SCH-48, SCH-50: in draft-07 every sibling of ``$ref`` is ignored,
    ``$id`` too, so the reference resolves against the enclosing base: a
    self-reference there is a cycle (refused), not a reference into the
    ``$id``'s resource that held a harmless schema."""
    schema = {
        "$schema": D07,
        "properties": {
            "count": {
                "$id": "https://x.test/count",
                "$ref": "#/properties/count",
                "properties": {"count": {"type": "integer"}},
            }
        },
    }
    with pytest.raises(Error) as exc:
        compile(
            schema,
            dialects=frozenset({"2020-12", "draft-07"}),
            limits=Limits.mcp(),
            allow_external_refs=False,
        )
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "ref_cycle"


@pytest.mark.parametrize(
    "spelling", ["HTTPS://A.TEST/amount", "https://a.test:443/amount", "https://a.test/%61mount"]
)
@pytest.mark.parametrize("source", ["registry", "loader"])
def test_sch_50_sch_17_a_respelt_id_cannot_stand_in_for_a_registry_uri(
    spelling: str, source: str
) -> None:
    """SCH-50, SCH-17: URIs are compared as the engine compares them (scheme
    and host in any case, default port or none, percent-encoding of
    unreserved characters decoded): an embedded resource spelling a registry
    URI differently is the resource the engine takes, so its cycle is found
    (it hid behind the registry entry: every instance was accepted)."""
    uri = "https://a.test/amount"
    schema = {
        "type": "object",
        "properties": {"amount": {"$ref": uri}},
        "$defs": {"decoy": {"$id": spelling, "$ref": uri}},
    }
    target = {"type": "integer"}
    options: dict[str, Any] = (
        {"schema_registry": {uri: target}}
        if source == "registry"
        else {"schema_loader": lambda _: target}
    )
    cache_clear()
    with pytest.raises(Error) as exc:
        compile(schema, **options).validate({"amount": "definitely not an integer"})
    assert refused(exc, ErrorClass.VALIDATION)["reason"] in {"ref_cycle", "duplicate_identifier"}


@pytest.mark.parametrize(
    "uri",
    [
        "http://json-schema.org/draft-04/schema#",
        "http://json-schema.org/draft-06/schema#",
        "https://json-schema.org/draft/2019-09/schema",
        "https://json-schema.org/draft-07/schema#",
        "HTTPS://JSON-SCHEMA.ORG/draft/2020-12/schema",
    ],
)
def test_sch_02_no_custom_meta_schema_under_a_json_schema_org_uri(uri: str) -> None:
    """SCH-02: a registry meta-schema at a URI the engine knows as another
    draft would be evaluated as that draft (``prefixItems``,
    ``dependentRequired`` ignored), whatever its own ``$schema`` says: any
    json-schema.org URI but the two supported ones is refused as a dialect."""
    vocab = "https://json-schema.org/draft/2020-12/vocab/"
    meta = {
        "$schema": D2020,
        "$vocabulary": {vocab + "core": True, vocab + "applicator": True},
    }
    schema = {"$schema": uri, "dependentRequired": {"a": ["b"]}}
    with pytest.raises(Error) as exc:
        compile(schema, schema_registry={uri: meta})
    assert exc.value.error_class is ErrorClass.UNSUPPORTED_CAPABILITY


def test_sch_46_a_registry_naming_one_resource_twice_is_refused() -> None:
    """SCH-46, SCH-17: a registry listing one URI with and without ``#`` (or
    spelt twice as the engine compares URIs) is ambiguous: its meaning would
    hang on insertion order while its fingerprint sorts the keys, so two
    callers could share one cached verdict for two meanings.  Refused."""
    schema = {"$ref": "https://r.test/x"}
    for registry in (
        {"https://r.test/x": {"type": "string"}, "https://r.test/x#": {"type": "integer"}},
        {"https://r.test/x": {"type": "string"}, "HTTPS://r.test/x": {"type": "integer"}},
    ):
        cache_clear()
        with pytest.raises(Error) as exc:
            compile(schema, schema_registry=registry)
        assert refused(exc, ErrorClass.VALIDATION)["reason"] == "duplicate_identifier"


def test_sch_48_sch_50_a_draft_07_anchor_beside_ref_is_still_an_anchor() -> None:
    """SCH-48, SCH-50: draft-07 ignores a base-changing ``$id`` beside
    ``$ref``, but an anchor (``"$id": "#foo"``) there is still one to the
    engine: a second ``#foo`` is refused as declared twice (the engine took
    the one beside ``$ref``, a cycle, while the checks read the other), and
    a lone one beside ``$ref`` resolves."""
    dialects = frozenset({"2020-12", "draft-07"})
    schema = {
        "$schema": D07,
        "properties": {"amount": {"$ref": "#foo"}},
        "definitions": {
            "b": {"$id": "#foo", "type": "integer", "maximum": 100},
            "z": {"$id": "#foo", "$ref": "#foo"},
        },
    }
    with pytest.raises(Error) as exc:
        compile(schema, dialects=dialects)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "duplicate_identifier"
    lone = {
        "$schema": D07,
        "properties": {"x": {"$ref": "#foo"}},
        "definitions": {
            "s": {"$id": "#foo", "$ref": "#/definitions/str"},
            "str": {"type": "string"},
        },
    }
    compiled = compile(lone, dialects=dialects)
    assert compiled.errors({"x": "text"}) == []
    assert compiled.errors({"x": 1}) != []


def test_sch_48_sch_50_both_dialects_positions_are_walked_under_a_nested_schema_keyword() -> None:
    """SCH-48, SCH-50, SCH-40: a draft-07 document's subschema declaring
    2020-12 without ``$id`` is evaluated by the engine with draft-07 keyword
    positions too (array ``items``, ``additionalItems``): the checks walk
    both dialects' positions, so a cycle there is refused (it compiled,
    every instance accepted), and a remote reference in ``additionalItems``
    is found by ``check_bounds``."""
    nested = {
        "$schema": D2020,
        "items": [{"$ref": "#/properties/p/items/0"}],
        "additionalItems": {"type": "string"},
    }
    schema = {"$schema": D07, "properties": {"p": nested}}
    mcp: dict[str, Any] = {
        "dialects": frozenset({"2020-12", "draft-07"}),
        "limits": Limits.mcp(),
        "allow_external_refs": False,
    }
    with pytest.raises(Error) as exc:
        compile(schema, **mcp)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "ref_cycle"
    remote = {
        "$schema": D07,
        "properties": {"p": {"$schema": D2020, "additionalItems": {"$ref": "http://x.test/"}}},
    }
    with pytest.raises(Error) as exc:
        check_bounds(remote, allow_external_refs=False)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "remote_ref"


@pytest.mark.parametrize("way", ["registry", "loader"])
def test_sch_48_the_root_document_alone_names_the_engine_dialect(way: str) -> None:
    """SCH-48, SCH-01: with both dialects accepted, the schema's own root
    decides which engine dialect evaluates it, never the root of a document
    it references: a 2020-12 root referencing a draft-07 document keeps
    ``prefixItems`` biting (it was ignored, so an invalid instance passed),
    and a draft-07 root referencing a 2020-12 document keeps array
    ``items``."""
    both = frozenset({"2020-12", "draft-07"})
    d07_doc = {"$schema": D07, "type": "integer"}
    d2020_doc = {"$schema": D2020, "type": "integer"}

    def source(uri: str, doc: dict[str, Any]) -> dict[str, Any]:
        if way == "registry":
            return {"schema_registry": {uri: doc}}
        return {"schema_loader": lambda asked: doc if asked == uri else None}

    modern = {
        "type": "object",
        "properties": {
            "n": {"$ref": "https://example.test/int07"},
            "pair": {"prefixItems": [{"type": "string"}]},
        },
    }
    compiled = compile(modern, dialects=both, **source("https://example.test/int07", d07_doc))
    assert compiled.errors({"n": 1, "pair": ["x"]}) == []
    assert compiled.errors({"n": 1, "pair": [1]}) != []
    assert compiled.errors({"n": "one"}) != []

    legacy = {
        "$schema": D07,
        "type": "object",
        "properties": {
            "n": {"$ref": "https://example.test/int2020"},
            "pair": {"items": [{"type": "string"}]},
        },
    }
    compiled = compile(legacy, dialects=both, **source("https://example.test/int2020", d2020_doc))
    assert compiled.errors({"n": 1, "pair": ["x"]}) == []
    assert compiled.errors({"n": 1, "pair": [1]}) != []
    assert compiled.errors({"n": "one"}) != []


def test_sch_05_a_supported_vocabulary_listed_optional_still_applies() -> None:
    """SCH-05, SCH-02: a custom meta-schema listing a vocabulary we support
    as optional (``false``) has it applied (2020-12 core 8.1.2): the engine,
    which switched it off, let ``{"n": "DROP TABLE"}`` through ``type`` and
    ``maximum``, and extra properties through ``additionalProperties``."""
    vocab = "https://json-schema.org/draft/2020-12/vocab/"
    meta_uri = "https://json-schema.org/draft/2020-12/meta/"

    def meta(optional: str) -> dict[str, Any]:
        names = ("core", "applicator", "validation", "unevaluated")
        return {
            "$schema": D2020,
            "$id": "https://meta.test/m",
            "$vocabulary": {vocab + v: v != optional for v in names},
            "$dynamicAnchor": "meta",
            "allOf": [{"$ref": meta_uri + m} for m in names],
        }

    schema = {
        "$schema": "https://meta.test/m",
        "type": "object",
        "properties": {"n": {"type": "integer", "maximum": 5}},
        "additionalProperties": False,
    }
    for optional, bad in (("validation", {"n": "DROP TABLE"}), ("applicator", {"n": 1, "x": 1})):
        cache_clear()
        with pytest.raises(Error) as exc:
            validate(schema, bad, schema_registry={"https://meta.test/m": meta(optional)})
        assert exc.value.error_class is ErrorClass.VALIDATION, optional


def test_sch_33_a_recursive_content_schema_is_judged_once_per_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SCH-33, SCH-30: a recursive ``contentSchema`` under ``anyOf`` judges
    each decoded text once per pass of the engine: refusing a 10-level
    argument of 193 bytes took 3**10 judgements (seconds; 259 s at 608
    bytes, on the caller's thread)."""
    import base64

    from trio_backplane.schema import _content

    calls: list[int] = []
    judge = _content._ContentSchema._judge

    def counted(self: Any, instance: str) -> Any:
        calls.append(1)
        return judge(self, instance)

    monkeypatch.setattr(_content._ContentSchema, "_judge", counted)
    content = {
        "type": "string",
        "contentEncoding": "base64",
        "contentMediaType": "application/json",
        "contentSchema": {"$ref": "#/$defs/c"},
    }
    schema = {
        "type": "object",
        "properties": {"d": {"$ref": "#/$defs/c"}},
        "$defs": {"c": {"anyOf": [{"type": "integer"}, content]}},
    }
    value: Any = "x"
    for _ in range(10):
        value = base64.b64encode(json.dumps(value).encode()).decode()
    with pytest.raises(Error) as exc:
        validate(schema, {"d": value}, content_assertion=True)
    assert exc.value.error_class is ErrorClass.VALIDATION
    assert len(calls) <= 3 * 10  # a pass or two of ten texts, not 3**10


def test_sch_30_content_with_a_number_no_double_holds_is_a_noted_failure() -> None:
    """SCH-30, SCH-49: decoded content holding ``1e400`` (valid JSON, no
    double holds it) cannot be compared faithfully: ``execution_failure``,
    as an integer past the digit limit is; it was a mismatch, which ``not``
    turned into a pass."""
    schema = {
        "type": "object",
        "properties": {
            "d": {
                "not": {
                    "contentMediaType": "application/json",
                    "contentSchema": {"type": "number", "minimum": 5},
                }
            }
        },
    }
    assert validate(schema, {"d": "1"}, content_assertion=True) == {"d": "1"}
    with pytest.raises(Error) as exc:
        validate(schema, {"d": "1e400"}, content_assertion=True)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "number_too_large"


def test_sch_48_sch_50_a_nested_schema_keyword_is_applied_where_it_appears() -> None:
    """SCH-48, SCH-50, SCH-33: the engine applies a nested ``$schema``
    without ``$id`` (2020-12 inside draft-07): an ``$id`` beside ``$ref``
    below it is honoured, so the checks follow the same references: a cycle
    there is refused (it compiled, every instance accepted) and a fan-out
    there is refused (validation ran for minutes), under the MCP options."""
    mcp: dict[str, Any] = {
        "dialects": frozenset({"2020-12", "draft-07"}),
        "limits": Limits.mcp(),
        "allow_external_refs": False,
    }
    cycle = {
        "$id": "http://x.test/m",
        "$ref": "#/definitions/z",
        "definitions": {"z": {"$ref": "#"}},
    }
    schema = {
        "$schema": D07,
        "definitions": {"z": {"type": "string"}},
        "properties": {"p": {"$schema": D2020, "properties": {"q": cycle}}},
    }
    with pytest.raises(Error) as exc:
        compile(schema, **mcp)
    assert refused(exc, ErrorClass.VALIDATION)["reason"] == "ref_cycle"
    defs: dict[str, Any] = {"d0": {"type": "integer"}}
    for i in range(1, 41):
        defs[f"d{i}"] = {"allOf": [{"$ref": f"#/definitions/d{i - 1}"}] * 2}
    fan = {"$id": "http://x.test/f", "$ref": "#/definitions/d40", "definitions": defs}
    schema = {"$schema": D07, "properties": {"p": {"$schema": D2020, "properties": {"q": fan}}}}
    with pytest.raises(Error) as exc:
        compile(schema, **mcp)
    assert refused(exc, ErrorClass.EXECUTION_FAILURE)["reason"] == "ref_fanout"
