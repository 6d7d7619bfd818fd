"""The real tool schemas of tests/fixtures are compatibility gates."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import FIXTURES
from trio_backplane import Error, ErrorClass
from trio_backplane.schema import compile, validate, validate_schema


def load(name: str) -> dict[str, dict[str, Any]]:
    records = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return {r["name"]: r for r in records}


def rejects(schema: dict[str, Any], arguments: dict[str, Any]) -> Error:
    with pytest.raises(Error) as exc:
        validate(schema, arguments)
    assert exc.value.error_class is ErrorClass.VALIDATION
    return exc.value


def test_sch_43_issue_46_forms() -> None:
    """SCH-43: the three issue #46 forms pass and their constraints bite."""
    tools = load("issue_46_tool_schemas.json")
    assert set(tools) == {"annotated_upload", "mixed_inputs", "constrained"}
    for record in tools.values():
        validate_schema(record["inputSchema"])
    constrained = tools["constrained"]["inputSchema"]
    good = {
        "count": 2,
        "code": "none",
        "tags": ["a"],
        "vars": {"x": 1},
        "attachment": {"url": "https://example.test"},
    }
    assert validate(constrained, good) is good
    assert "minLength" in {
        e["keyword"] for e in rejects(constrained, {**good, "code": "A"}).details["errors"]
    }
    assert "pattern" in {
        e["keyword"] for e in rejects(constrained, {**good, "code": "AB"}).details["errors"]
    }
    rejects(constrained, {**good, "attachment": {"url": "u", "content": "c"}})
    upload = tools["annotated_upload"]["inputSchema"]
    validate(upload, {"archive": "%%% not base64 %%%"})
    mixed = tools["mixed_inputs"]["inputSchema"]
    validate(mixed, {"value": None, "metadata": [1], "choice": "basic", "files": ["a"]})
    rejects(mixed, {"value": None, "metadata": 1, "choice": "expert", "files": []})


def test_sch_44_sigma_builtin_tools() -> None:
    """SCH-44: the ten Sigma schemas pass and their constraints bite."""
    tools = load("sigma_builtin_tool_schemas.json")
    assert len(tools) == 10
    for record in tools.values():
        validate_schema(record["inputSchema"])
    read = tools["read"]["inputSchema"]
    validate(read, {"path": "a.txt", "offset": 1})
    rejects(read, {"path": "a.txt", "offset": 0})
    todo = tools["todo"]["inputSchema"]
    validate(todo, {"action": "add", "content": "x", "status": "pending"})
    rejects(todo, {"action": "archive"})
    rejects(todo, {"action": "update", "status": "done"})
    ask = tools["ask_user_question"]["inputSchema"]
    validate(ask, {"question": "?", "options": ["a", {"label": "b", "value": "b"}]})
    errors = rejects(ask, {"question": "?", "options": [{"value": "b"}]}).details["errors"]
    assert any(e["keyword"] == "oneOf" for e in errors)


def test_sch_45_github_server_examples() -> None:
    """SCH-45: the twelve GitHub MCP schemas pass; each example gets its recorded verdict."""
    tools = load("mcp_github_server_tools.json")
    assert len(tools) == 12
    checked = 0
    for name, record in tools.items():
        compiled = compile(record["inputSchema"])
        for example in record.get("examples", ()):
            arguments = example["arguments"]
            if example["valid_against_inputSchema"]:
                assert compiled.validate(arguments) is arguments, (name, example["note"])
            else:
                with pytest.raises(Error) as exc:
                    compiled.validate(arguments)
                assert exc.value.error_class is ErrorClass.VALIDATION, (name, example["note"])
            checked += 1
    assert checked >= 7


def test_live_catalog_schemas_all_preflight() -> None:
    """SCH-43 (spec 000 compatibility evidence): all 58 captured tools pass preflight,
    each schema retained unchanged (preflight never rewrites the input)."""
    records = json.loads((FIXTURES / "issue_46_live_catalog.json").read_text(encoding="utf-8"))
    assert len(records) == 58
    for record in records:
        before = json.dumps(record["inputSchema"])
        compiled = compile(record["inputSchema"])
        assert json.dumps(record["inputSchema"]) == before
        assert json.dumps(compiled.schema, sort_keys=True) == json.dumps(
            record["inputSchema"], sort_keys=True
        )
