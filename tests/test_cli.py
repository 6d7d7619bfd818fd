"""The ``backplane`` command line (the README main job)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from trio_backplane.cli import main


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def test_schema_check_example_reports_each_tool() -> None:
    """The shipped example: one line per tool and a summary; the draft-04 tool is refused."""
    status, text = run("schema", "check", "--example")
    assert status == 0
    lines = text.strip().splitlines()
    assert lines[-1] == "5 tools: 4 accepted, 1 rejected"
    assert any(line.startswith("rejected  legacy_lookup  unsupported_capability") for line in lines)
    assert sum(line.startswith("accepted") for line in lines) == 4
    assert run("schema", "check", "--example", "--strict")[0] == 1


def test_schema_check_reads_arrays_and_tools_list_results(tmp_path: Path) -> None:
    """Both file shapes: a JSON array and an MCP tools/list (JSON-RPC) result."""
    records = json.loads((FIXTURES / "issue_46_live_catalog.json").read_text())
    array = tmp_path / "array.json"
    array.write_text(json.dumps(records))
    listing = tmp_path / "list.json"
    listing.write_text(json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"tools": records}}))
    for path in (array, listing):
        status, text = run("schema", "check", str(path), "--strict")
        assert status == 0
        assert text.strip().splitlines()[-1] == "58 tools: 58 accepted, 0 rejected"


def test_schema_check_options_and_bad_files(tmp_path: Path) -> None:
    """--draft-07 admits a draft-07 tool; an unreadable file is exit status 2."""
    tool = {"name": "old", "inputSchema": {"$schema": "http://json-schema.org/draft-07/schema#"}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps([tool]))
    assert run("schema", "check", str(path), "--strict")[0] == 1
    assert run("schema", "check", str(path), "--strict", "--draft-07")[0] == 0
    status, text = run("schema", "check", str(path), "--mcp-limits")
    assert "rejected" in text
    assert status == 0
    path.write_text("{not json")
    assert run("schema", "check", str(path))[0] == 2
    path.write_text(json.dumps({"tools": "nope"}))
    assert run("schema", "check", str(path))[0] == 2
    assert run("schema", "check", str(tmp_path / "missing.json"))[0] == 2


def test_console_script_entry_point() -> None:
    """``python -m trio_backplane.cli`` works as the installed ``backplane`` does."""
    done = subprocess.run(
        [sys.executable, "-m", "trio_backplane.cli", "schema", "check", "--example"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "5 tools: 4 accepted, 1 rejected" in done.stdout


def test_usage_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["schema"])
    assert exc.value.code == 2


def test_catalog_admit_live_catalog_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CAT-15: ``catalog admit`` admits the 58-tool capture strictly and warns about
    names outside MCP's advisory character set (CAT-01)."""
    path = FIXTURES / "issue_46_live_catalog.json"
    status, text = run("catalog", "admit", str(path))
    assert status == 0
    assert "58 tools: 58 accepted, 0 rejected" in text
    assert "github::get_me" in text
    assert "rejected" not in text.replace("0 rejected", "")
    assert "github::get_me" in capsys.readouterr().err


def test_catalog_admit_strict_and_quarantine(tmp_path: Path) -> None:
    """CAT-03, CAT-04: strict fails the batch (exit 1, class and message); quarantine
    prints the rejected tool with its class and reason."""
    tools = [
        {"name": "good", "inputSchema": {"type": "object"}},
        {"name": "old", "inputSchema": {"$schema": "http://json-schema.org/draft-07/schema#"}},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(tools))
    status, text = run("catalog", "admit", str(path))
    assert status == 1
    assert "unsupported_capability" in text
    assert "draft-07" in text
    status, text = run("catalog", "admit", str(path), "--mode", "quarantine")
    assert status == 0
    assert "2 tools: 1 accepted, 1 rejected" in text
    old_row = next(line for line in text.splitlines() if " old " in line)
    assert "rejected" in old_row
    assert "unsupported_capability" in old_row
    assert run("catalog", "admit", str(path), "--draft-07")[0] == 0


def test_catalog_admit_fatal_and_bad_input(tmp_path: Path) -> None:
    """CAT-05, CAT-06: quarantine never hides a validation error or duplicate names."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"name": "a", "inputSchema": {"$ref": "#/$defs/missing"}}]))
    status, text = run("catalog", "admit", str(path), "--mode", "quarantine")
    assert status == 1
    assert "validation" in text
    path.write_text(json.dumps([{"name": "a", "inputSchema": {}}] * 2))
    status, text = run("catalog", "admit", str(path), "--mode", "quarantine")
    assert status == 1
    assert "duplicate tool names" in text
    path.write_text(json.dumps([{"name": "has space", "inputSchema": {}}]))
    assert run("catalog", "admit", str(path))[0] == 1
    path.write_text("{not json")
    assert run("catalog", "admit", str(path))[0] == 2
    with pytest.raises(SystemExit) as exc:
        main(["catalog", "admit", str(path), "--mode", "lenient"])
    assert exc.value.code == 2


def test_catalog_admit_plain_output_without_rich(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without rich the same rows are printed as plain lines."""
    monkeypatch.setitem(sys.modules, "rich.console", None)
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            [
                {"name": "a::b", "inputSchema": {}},
                {"name": "x", "inputSchema": {"$defs": {"u": {"$schema": "urn:nope"}}}},
            ]
        )
    )
    status, text = run("catalog", "admit", str(path), "--mode", "quarantine")
    assert status == 0
    lines = text.strip().splitlines()
    assert lines[0] == "accepted  a::b (!)"
    assert lines[1].startswith("rejected  x  unsupported_capability")
    assert lines[-1] == "2 tools: 1 accepted, 1 rejected"
