"""The ``backplane`` command line (the README main job)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import FIXTURES, LINUX_ONLY
from tests.store.unreadable import unreadable_runs
from trio_backplane.cli import _demo as demo
from trio_backplane.cli import main
from trio_backplane.kernel import SCHEMA_VERSION, Command, RunRecord, thaw, transition
from trio_backplane.store import PostgresStore, SQLiteStore
from trio_backplane.testing import RecoveryHarness

pytest_plugins = ["tests.store.postgres_fixture"]


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


# -- backplane demo and backplane runs (issue 7 item 4) ---------------------------------

README = Path(__file__).resolve().parent.parent / "README.md"
RUN_ID_PATTERN = re.compile(r"demo-\d{8}T\d{6}Z-[0-9a-f]{6}")
CANARY = "sk-canary-7f3e9b2d41c6a5e8"


def _load(db: Path, run_id: str) -> Any:
    async def load() -> Any:
        async with SQLiteStore(db) as store:
            return await store.load(run_id)

    return trio.run(load)


def _demo(tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    """``backplane demo`` in-process (no pacing): status, output and the run id."""
    status, text = run("demo", "--db", str(tmp_path / "demo.sqlite3"), "--pace", "0", *extra)
    found = RUN_ID_PATTERN.search(text)
    assert found, text
    return status, text, found.group(0)


def _cli(*argv: str, stdin: str = "", env: dict[str, str] | None = None) -> Any:
    """The installed entry point in a subprocess (standard input is not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "trio_backplane.cli", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def _tool_messages(record: Any) -> dict[str, Any]:
    messages = thaw(record.conversation["messages"])
    return {m["name"]: m["result"] for m in messages if m["role"] == "tool"}


def test_demo_approved_runs_every_tool_and_stores_a_completed_run(tmp_path: Path) -> None:
    """The whole demo: two read-only calls and one approved write, the event
    stream shown line by line, a completed run in SQLite, the note on disk."""
    events = tmp_path / "events.jsonl"
    status, text, run_id = _demo(tmp_path, "--approve", "yes", "--events", str(events))
    assert status == 0, text
    for line in (
        "user ▸ Give me a quick tour",
        "assistant ▸ I'll look at the package's public names",
        "tool ✓ read_package_file",
        "tool ✓ search_glossary",
        "approval needed write_note",
        "→ approved",
        "tool ✓ write_note  wrote",
        "run completed",
    ):
        assert line in text
    assert re.search(r"run state\s+│ completed", text)
    assert re.search(r"work used\s+│ 6 of 20", text)
    assert f"backplane runs show sqlite:///{tmp_path}/demo.sqlite3 {run_id}" in text
    note = tmp_path / "backplane-demo-notes" / f"{demo.NOTE_TITLE}.md"
    assert note.read_text().startswith(f"# {demo.NOTE_TITLE}\n")
    record = _load(tmp_path / "demo.sqlite3", run_id)
    assert record.state == "completed"
    results = _tool_messages(record)
    assert set(results) == {"read_package_file", "search_glossary", "write_note"}
    assert not any(r["is_error"] for r in results.values())
    assert record.budget.used == 6
    types = [json.loads(line)["type"] for line in events.read_text().splitlines()]
    assert types.count("interaction_requested") == 1
    assert types.count("tool_completed") == 3
    assert types[-1] == "run_completed"


def test_demo_otel_prints_the_span_tree(tmp_path: Path) -> None:
    """``backplane demo --otel``: the run's spans, once, as a tree: the run,
    its turn, three provider attempts, three tool calls and the approval's
    wait under the turn, the store commits under the run."""
    status, text, _ = _demo(tmp_path, "--approve", "yes", "--otel")
    assert status == 0, text
    tree = text[text.index("spans (") :].splitlines()
    assert tree[1].startswith("  invoke_agent backplane-demo ")
    assert "state=completed" in tree[1]
    indented = {line.strip().split(" ")[0]: len(line) - len(line.lstrip()) for line in tree[1:]}
    assert indented["turn"] == 4
    assert indented["commit"] == 4
    assert indented["chat"] == indented["await_human"] == indented["execute_tool"] == 6
    names = [line.strip().rsplit(" ms", 1)[0].rsplit(" ", 1)[0] for line in tree[1:]]
    assert names.count("chat") == 3
    for tool in ("read_package_file", "search_glossary", "write_note"):
        assert f"execute_tool {tool}" in names


def test_demo_denied_completes_without_writing(tmp_path: Path) -> None:
    """--approve no: the write is an "approval denied" error result that uses no
    work; the model carries on and the run still completes; nothing is written."""
    status, text, run_id = _demo(tmp_path, "--approve", "no")
    assert status == 0, text
    assert "→ denied" in text
    assert "tool ✗ write_note  forbidden: approval denied" in text
    assert "The note was not written" in text
    assert not (tmp_path / "backplane-demo-notes").exists()
    record = _load(tmp_path / "demo.sqlite3", run_id)
    assert record.state == "completed"
    write = _tool_messages(record)["write_note"]
    assert write["is_error"]
    assert write["error"]["class"] == "forbidden"
    assert record.budget.used == 5
    assert not any(
        key.startswith("tool:") and "write" in str(v) for key, v in record.intents.items()
    )


def test_demo_asks_at_the_terminal_and_defaults_to_yes_without_one(tmp_path: Path) -> None:
    """--approve ask reads the answer from standard input (EOF answers no); with no
    flag and no terminal the demo approves."""
    yes = _cli(
        "demo", "--db", str(tmp_path / "a.sqlite3"), "--approve", "ask", "--pace", "0", stdin="y\n"
    )
    assert yes.returncode == 0, yes.stderr
    assert "approve write_note? [y/N]" in yes.stdout
    assert (tmp_path / "backplane-demo-notes" / f"{demo.NOTE_TITLE}.md").exists()
    eof = _cli(
        "demo",
        "--db",
        str(tmp_path / "b.sqlite3"),
        "--approve",
        "ask",
        "--pace",
        "0",
        "--notes",
        str(tmp_path / "eof-notes"),
    )
    assert eof.returncode == 0, eof.stderr
    assert "→ denied" in eof.stdout
    assert not (tmp_path / "eof-notes").exists()
    default = _cli(
        "demo",
        "--db",
        str(tmp_path / "c.sqlite3"),
        "--pace",
        "0",
        "--notes",
        str(tmp_path / "default-notes"),
    )
    assert default.returncode == 0, default.stderr
    assert "approvals yes" in default.stdout
    assert (tmp_path / "default-notes" / f"{demo.NOTE_TITLE}.md").exists()


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """One SQLite store holding an approved and a denied demo run."""
    base = tmp_path_factory.mktemp("demo_store")
    approved = _demo(base, "--approve", "yes")
    denied = _demo(base, "--approve", "no")
    assert approved[0] == denied[0] == 0
    return base / "demo.sqlite3", approved[2], denied[2]


def test_runs_list(demo_store: tuple[Path, str, str]) -> None:
    """Every run with its state; sqlite:/// URLs and bare paths alike; --json; --state."""
    db, approved, denied = demo_store
    for url in (f"sqlite:///{db}", str(db)):
        status, text = run("runs", "list", url)
        assert status == 0
        assert approved in text
        assert denied in text
        assert "2 runs" in text
    status, text = run("runs", "list", str(db), "--json")
    rows = {row["run_id"]: row for row in json.loads(text)}
    assert rows[approved]["state"] == rows[denied]["state"] == "completed"
    assert rows[approved]["work"] == "6/20"
    assert rows[approved]["messages"] == 7
    assert json.loads(run("runs", "list", str(db), "--json", "--state", "failed")[1]) == []
    misspelt = _cli("runs", "list", str(db), "--state", "complete")  # a usage mistake
    assert misspelt.returncode == 2
    assert "invalid choice: 'complete'" in misspelt.stderr


def test_runs_show(demo_store: tuple[Path, str, str]) -> None:
    """Transcript, intents with status and effect_class, outcome and budget."""
    db, approved, denied = demo_store
    status, text = run("runs", "show", f"sqlite:///{db}", approved)
    assert status == 0
    assert f"run {approved}" in text
    assert re.search(r"state\s+│ completed", text)
    assert re.search(r"budget\s+│ 6 of 20 used", text)
    assert "→ write_note" in text
    assert "✓ wrote" in text
    intents = [line for line in text.splitlines() if line.startswith("│ tool:invocation")]
    assert len(intents) == 3
    assert sum("read_only" in line for line in intents) == 2
    write = next(line for line in intents if "write_note" in line)
    assert "consumed" in write
    assert "mutation" in write
    assert "outcome completed" in text
    status, text = run("runs", "show", str(db), denied)
    assert "✗ forbidden: approval denied" in text
    assert not any("write_note" in line for line in text.splitlines() if "invocation" in line)
    data = json.loads(run("runs", "show", str(db), approved, "--json")[1])
    assert data["run_id"] == approved
    assert data["state"] == "completed"
    assert run("runs", "show", str(db), "no-such-run")[0] == 1


def test_runs_show_prints_the_latest_rows_of_a_long_run(tmp_path: Path) -> None:
    """A run with more transcript messages than a table prints (500) shows
    the latest ones and says how many earlier rows it left out; ``--json``
    has them all."""
    db = tmp_path / "runs.sqlite3"
    messages = [{"role": "user", "content": f"message {i}"} for i in range(600)]

    async def long_run() -> None:
        async with SQLiteStore(db) as store:
            record = RunRecord.new("long", context={"conversation": {}}, transcript=messages)
            await store.create(record)

    trio.run(long_run)
    status, text = run("runs", "show", str(db), "long")
    assert status == 0
    assert "100 earlier rows not shown (--json prints them all)" in text
    assert "message 599" in text
    assert "message 99 " not in text
    data = json.loads(run("runs", "show", str(db), "long", "--json")[1])
    assert len(data["transcript"]) == 600


@pytest.mark.parametrize(
    "run_id",
    ["run-[/bold]", "run-\x1b]0;TITLE\x1b\\\x1b[31mRED", "run-[link=https://x.test/]c[/link]"],
)
def test_runs_show_prints_a_hostile_run_id_as_text(tmp_path: Path, run_id: str) -> None:
    """A run id is any Unicode text: ``runs show`` prints it in the table
    title as text, never as markup (``[/bold]`` crashed rich) and without
    its control characters (an escape sequence reached the terminal)."""
    db = tmp_path / "runs.sqlite3"

    async def create() -> None:
        async with SQLiteStore(db) as store:
            await store.create(RunRecord.new(run_id))

    trio.run(create)
    status, text = run("runs", "show", str(db), run_id)
    assert status == 0, text
    assert "\x1b" not in text
    assert run_id.replace("\x1b", "")[:8] in text


def test_spinner_text_is_never_markup() -> None:
    """The terminal spinner shows model text (a tool name being written) as
    text: ``[/bold]`` in it crashed the demo on a terminal."""
    from rich.console import Console

    from trio_backplane.cli import _Out

    out = _Out(io.StringIO())
    out.console = Console(file=io.StringIO(), force_terminal=True)
    out.spin("the model is writing a call to [/bold]x[link=https://x.test/]")
    out.spin("and [/red]")
    out.stop()


def test_demo_with_a_store_path_that_is_no_store_says_so(tmp_path: Path) -> None:
    """``demo --db`` naming a directory or a file that is not a database
    fails with the store's classed reason on one line, never a traceback
    (the refusal arrived wrapped in the nursery's exception group)."""
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a database\n" * 100)
    for db in (tmp_path, text_file):
        done = _cli("demo", "--db", str(db), "--pace", "0", "--approve", "yes")
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert "backplane: demo failed: storage_failed" in done.stderr


def test_demo_hides_a_token_in_the_base_url(tmp_path: Path) -> None:
    """A bearer token written as the base URL's userinfo is hidden from the
    printed ``model ... at ...`` line, as a DSN's password is."""
    done = _cli(
        "demo",
        "--db",
        str(tmp_path / "demo.sqlite3"),
        "--provider",
        "openai",
        "--base-url",
        f"http://user:sk-head@TOPSECRET@127.0.0.1:{_closed_port()}/v1",
        "--model",
        "m",
        "--approve",
        "yes",
    )
    assert "TOPSECRET" not in done.stdout + done.stderr
    assert "sk-head" not in done.stdout + done.stderr
    assert "***@127.0.0.1" in done.stdout


def test_runs_recover_is_read_only_unless_fenced(tmp_path: Path) -> None:
    """A completed run has nothing outstanding; a crashed one lists its dispatched
    mutation as uncertain; only --fence moves the stored incarnation."""
    status, _, run_id = _demo(tmp_path, "--approve", "yes")
    db = tmp_path / "demo.sqlite3"
    status, text = run("runs", "recover", f"sqlite:///{db}", run_id)
    assert status == 0
    assert "for incarnation 2 (fences incarnation 1)" in text
    assert "no outstanding effects" in text
    assert "read-only: nothing was fenced" in text
    assert _load(db, run_id).incarnation == 1

    async def crash() -> None:
        async with SQLiteStore(db) as store:
            record = RunRecord.new("crashed")
            await RecoveryHarness.crash(store, record, "after_mutation", fence=False)

    trio.run(crash)
    status, text = run("runs", "recover", str(db), "crashed", "--json")
    report = json.loads(text)
    assert report["incarnation"] == 2
    assert report["uncertain_effects"]
    [effect] = [e for e in report["effects"] if e["effect_id"] in report["uncertain_effects"]]
    assert effect["effect_class"] == "mutation"
    assert not effect["safe_to_resume"]
    status, text = run("runs", "recover", str(db), "crashed")
    assert "uncertain (reconcile by hand)" in text
    assert _load(db, "crashed").incarnation == 1
    status, text = run("runs", "recover", str(db), "crashed", "--incarnation", "5", "--fence")
    assert status == 0
    assert "fenced: incarnation 1 can no longer commit" in text
    assert _load(db, "crashed").incarnation == 5
    status, text = run("runs", "recover", str(db), "crashed", "--incarnation", "5")
    assert status == 1  # forbidden: 5 does not fence anything older
    status, text = run("runs", "recover", str(db), "crashed", "--settle")
    assert status == 0
    assert "settled: incarnation 5 fenced; the run is now unknown_outcome" in text
    settled = _load(db, "crashed")
    assert (settled.state, settled.incarnation) == ("unknown_outcome", 6)
    assert settled.outcome["evidence"][0]["effect_class"] == "mutation"
    status, text = run("runs", "recover", str(db), "crashed", "--settle")
    assert "settled already: the run is unknown_outcome" in text


def test_runs_recover_lists_unsettled_children_and_waits(tmp_path: Path) -> None:
    """STO-14: a run waiting on a child run has no outstanding effect, but it
    is not "nothing to reconcile": the child and the wait are listed (and in
    ``--json`` as ``unsettled``)."""
    db = tmp_path / "runs.sqlite3"

    async def waiting() -> None:
        async with SQLiteStore(db) as store:
            record = RunRecord.new("waiting")
            await store.create(record)
            for n, (kind, data) in enumerate(
                (("admit", {"state": "running"}), ("wait_started", {"dependency": "child-7"}))
            ):
                new, events = transition(record, Command(kind, at=1.0, input=data))
                await store.commit(
                    "waiting", incarnation=1, expected_revision=n, record=new, events=events
                )
                record = new

    trio.run(waiting)
    status, text = run("runs", "recover", str(db), "waiting")
    assert status == 0
    assert "nothing to withdraw" not in text
    assert re.search(r"unsettled dependencies .*child-7", text)
    report = json.loads(run("runs", "recover", str(db), "waiting", "--json")[1])
    assert report["unsettled"]["dependencies"] == ["child-7"]
    # a wait is no effect: settling it is confirmed, and nothing is replayed
    status, text = run("runs", "recover", str(db), "waiting", "--settle")
    assert "the run is now cancelled (stop reason recovered)" in text


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_demo_openai_unreachable_is_classed_and_never_leaks_the_key(tmp_path: Path) -> None:
    """A canary API key (OPENAI_API_KEY) with an endpoint on a closed loopback port:
    a classed transient_transport failure, a failed run stored, and the key in
    neither the SQLite files, the event lines, nor standard output or error."""
    db = tmp_path / "openai.sqlite3"
    events = tmp_path / "events.jsonl"
    done = _cli(
        "demo",
        "--provider",
        "openai",
        "--base-url",
        f"http://127.0.0.1:{_closed_port()}/v1",
        "--model",
        "demo-model",
        "--db",
        str(db),
        "--events",
        str(events),
        "--approve",
        "yes",
        env={"OPENAI_API_KEY": CANARY},
    )
    assert done.returncode == 1, done.stderr
    assert "response failed  transient_transport" in done.stdout
    assert re.search(r"run state\s+│ failed", done.stdout)
    run_id = RUN_ID_PATTERN.search(done.stdout)
    assert run_id
    record = _load(db, run_id.group(0))
    assert record.state == "failed"
    assert record.outcome["error"]["class"] == "transient_transport"
    shown = run("runs", "show", str(db), run_id.group(0))[1]
    assert "transient_transport" in shown
    files = [p for p in tmp_path.iterdir() if p.name.startswith(db.name)] + [events]
    assert events.read_text()
    for path in files:
        assert CANARY.encode() not in path.read_bytes(), path
    for text in (done.stdout, done.stderr, shown):
        assert CANARY not in text


def test_demo_and_runs_usage_errors_exit_2(tmp_path: Path) -> None:
    for argv in (
        ["demo", "--approve", "maybe"],
        ["demo", "--provider", "claude"],
        ["demo", "--pace", "soon"],
        ["runs"],
        ["runs", "show", "x.sqlite3"],
        ["runs", "recover", "x.sqlite3", "r", "--incarnation", "two"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv, out=io.StringIO())
        assert exc.value.code == 2, argv
    assert run("demo", "--provider", "openai", "--model", "m")[0] == 2
    assert run("demo", "--provider", "anthropic")[0] == 2
    assert run("demo", "--provider", "anthropic", "--base-url", "ftp://x", "--model", "m")[0] == 2
    assert run("demo", "--provider", "openai", "--base-url", "ftp://x", "--model", "m")[0] == 2
    assert run("demo", "--pace", "-1")[0] == 2
    assert run("demo", "--pace", "nan")[0] == 2
    assert run("demo", "--events", str(tmp_path / "no" / "such" / "dir.jsonl"))[0] == 2
    missing = tmp_path / "missing.sqlite3"
    for url in (str(missing), f"sqlite:///{missing}", "sqlite://", "mysql://db/x"):
        assert run("runs", "list", url)[0] == 2, url
    assert not missing.exists()  # reading never creates a store


def test_demo_plain_output_without_rich(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without rich the demo prints the same lines, unstyled."""
    monkeypatch.setitem(sys.modules, "rich.console", None)
    status, text, _ = _demo(tmp_path, "--approve", "yes")
    assert status == 0
    assert "tool ✓ write_note" in text
    assert "run state  completed" in text


def _readme_section(heading: str) -> str:
    text = README.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _run_snippet(code: str, cwd: Path) -> list[str]:
    """Run a README snippet as a script (warnings are errors): its output lines."""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_readme_permission_example_runs(tmp_path: Path) -> None:
    """The README's permission-prompt example, extracted and run as written."""
    section = _readme_section("## Answering a permission prompt in code")
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    assert "conversation.subscribe()" in code
    assert 'await conversation.resolve(event.payload["interaction_id"], "approved")' in code
    assert "requires_approval=True" in code
    assert _run_snippet(code, tmp_path) == [
        "approving deploy {'service': 'billing'}",
        "completed | deployed billing",
    ]


def test_readme_mcp_example_runs() -> None:
    """The README's MCP example, extracted and run as written (from the
    repository root, where its test server lives)."""
    section = _readme_section("## Tools from an MCP server")
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    assert "connect_stdio(" in code
    assert "validate_arguments=True" in code
    assert _run_snippet(code, README.parent) == [
        "refused: deep too_deep",
        "completed | {'id': 7, 'name': 'user-7'}",
    ]


def test_readme_commands() -> None:
    """The first README command is the demo; the test command is .ci/run's."""
    section = _readme_section("## The two commands")
    first, second = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    assert first == (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[cli]' && .venv/bin/backplane demo"
    )
    assert second == "python3 -m pip install --quiet nox && python3 -m nox -s tests"
    ci = (README.parent / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == second


def test_runs_on_postgresql(pg_dsn: str, pg_schema: str) -> None:
    """``runs list/show/recover`` read a PostgreSQL store given by its DSN."""
    from tests.store.postgres_fixture import _drop_schema

    async def crash() -> None:
        async with PostgresStore(pg_dsn, schema=pg_schema) as store:
            await RecoveryHarness.crash(
                store, RunRecord.new("pg-run"), "after_mutation", fence=False
            )

    trio.run(crash)
    url = pg_dsn + ("&" if "?" in pg_dsn else "?") + f"options=-csearch_path%3D{pg_schema}"
    try:
        status, text = run("runs", "list", url, "--json")
        assert status == 0
        assert [row["run_id"] for row in json.loads(text)] == ["pg-run"]
        status, text = run("runs", "show", url, "pg-run")
        assert status == 0
        assert "mutation" in text
        status, text = run("runs", "recover", url, "pg-run", "--fence")
        assert status == 0
        assert "uncertain (reconcile by hand)" in text
        assert "fenced: incarnation 1 can no longer commit" in text
    finally:
        _drop_schema(pg_dsn, pg_schema)


def test_runs_on_a_postgresql_database_that_holds_no_store(pg_dsn: str, pg_schema: str) -> None:
    """``runs list/show/recover`` on a PostgreSQL database (here: a schema on
    the search path) holding another application's tables, not a store:
    a usage error (exit 2, "not a trio_backplane store"), as for a SQLite
    file, and no table is added to it."""
    import psycopg
    from psycopg import sql

    from tests.store.postgres_fixture import _drop_schema

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(pg_schema)))
        conn.execute(
            sql.SQL("CREATE TABLE {}.customers (id int)").format(sql.Identifier(pg_schema))
        )
    url = pg_dsn + ("&" if "?" in pg_dsn else "?") + f"options=-csearch_path%3D{pg_schema}"
    try:
        for argv in (("list",), ("show", "some-run"), ("recover", "some-run")):
            status, _ = run("runs", *argv, url)
            assert status == 2, argv
        with psycopg.connect(pg_dsn) as conn:
            tables = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (pg_schema,),
            ).fetchall()
        assert [t for (t,) in tables] == ["customers"]
    finally:
        _drop_schema(pg_dsn, pg_schema)


def test_demo_with_the_openai_provider_against_a_chat_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``backplane demo --provider openai`` end to end against a loopback
    chat-completions server scripted like a model: two read-only calls, the
    approved write, a summary.  The run completes in SQLite, the note is
    written, every later request carries the tool results, and the API key
    goes only into the Authorization header: never the store, never output."""
    from tests.adapters.chat_server import ChatServer, text_chunks, tool_call_chunks

    note = {"title": demo.NOTE_TITLE, "body": "written through the OpenAI adapter"}
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    with ChatServer().running() as chat:
        chat.add(
            tool_call_chunks(
                ("call_read", "read_package_file", '{"path": "__init__.py", "max_lines": 3}'),
                ("call_search", "search_glossary", '{"query": "approval", "limit": 1}'),
            ),
            tool_call_chunks(("call_note", "write_note", json.dumps(note))),
            text_chunks("All three tools ran.", usage={"total_tokens": 42}),
        )
        status, text = run(
            "demo",
            "--provider",
            "openai",
            "--base-url",
            chat.base_url,
            "--model",
            "scripted-model",
            "--db",
            str(tmp_path / "demo.sqlite3"),
            "--approve",
            "yes",
        )
    assert status == 0, text
    for line in ("tool ✓ read_package_file", "tool ✓ search_glossary", "tool ✓ write_note"):
        assert line in text
    assert "assistant ▸ All three tools ran." in text
    found = RUN_ID_PATTERN.search(text)
    assert found, text
    record = _load(tmp_path / "demo.sqlite3", found.group(0))
    assert record.state == "completed"
    assert not any(r["is_error"] for r in _tool_messages(record).values())
    written = tmp_path / "backplane-demo-notes" / f"{demo.NOTE_TITLE}.md"
    assert "written through the OpenAI adapter" in written.read_text()
    assert len(chat.requests) == 3
    assert all(body["model"] == "scripted-model" for body in chat.requests)
    tool_ids = [m.get("tool_call_id") for m in chat.requests[2]["messages"] if m["role"] == "tool"]
    assert tool_ids == ["call_read", "call_search", "call_note"]
    assert all(h.get("Authorization") == f"Bearer {CANARY}" for h in chat.headers)
    assert CANARY not in text
    for path in tmp_path.iterdir():
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path


def test_demo_with_the_anthropic_provider_against_a_messages_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``backplane demo --provider anthropic --model M`` end to end against a
    loopback server streaming Messages events: the three tools (the write
    approved), thinking sent back with its signature, tool results as
    ``tool_result`` blocks, and ANTHROPIC_API_KEY only in ``x-api-key``."""
    from tests.adapters.chat_server import ChatServer, message_stream

    note = {"title": demo.NOTE_TITLE, "body": "written through the Anthropic adapter"}
    thinking = {"type": "thinking", "thinking": "read first", "signature": "c2lnbmVk"}

    def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
        return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}

    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY)
    with ChatServer().running() as server:
        server.add(
            message_stream(
                thinking,
                call("toolu_read", "read_package_file", {"path": "__init__.py", "max_lines": 3}),
                call("toolu_search", "search_glossary", {"query": "approval", "limit": 1}),
                stop_reason="tool_use",
            ),
            message_stream(call("toolu_note", "write_note", note), stop_reason="tool_use"),
            message_stream({"type": "text", "text": "All three tools ran."}),
        )
        status, text = run(
            "demo",
            "--provider",
            "anthropic",
            "--base-url",
            server.base_url.removesuffix("/v1"),
            "--model",
            "claude-scripted",
            "--db",
            str(tmp_path / "demo.sqlite3"),
            "--approve",
            "yes",
        )
    assert status == 0, text
    for line in ("tool ✓ read_package_file", "tool ✓ search_glossary", "tool ✓ write_note"):
        assert line in text
    assert "assistant ▸ All three tools ran." in text
    written = tmp_path / "backplane-demo-notes" / f"{demo.NOTE_TITLE}.md"
    assert "written through the Anthropic adapter" in written.read_text()
    assert len(server.requests) == 3
    assert all(body["model"] == "claude-scripted" for body in server.requests)
    assert server.requests[1]["messages"][1]["content"][0] == thinking
    results = [
        block["tool_use_id"]
        for message in server.requests[2]["messages"]
        if message["role"] == "user"
        for block in message["content"]
        if block["type"] == "tool_result"
    ]
    assert results == ["toolu_read", "toolu_search", "toolu_note"]
    assert all(h.get("x-api-key") == CANARY for h in server.headers)
    assert CANARY not in text
    for path in tmp_path.iterdir():
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path


def test_readme_continuation_example_runs(tmp_path: Path) -> None:
    """The README's continuation example (messages= of a new run), as written."""
    section = _readme_section("## Continuing a finished conversation")
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    assert "messages=earlier" in code
    assert _run_snippet(code, tmp_path) == [
        "['user', 'assistant', 'user']",
        "completed | About 2.1 million.",
    ]
    runs = trio.run(_list_runs, tmp_path / "chat.sqlite3")
    assert [(r.run_id, r.state) for r in runs] == [("chat-1", "completed"), ("chat-2", "completed")]


async def _list_runs(path: Path) -> Any:
    async with SQLiteStore(path) as store:
        return await store.list_runs()


def test_runs_list_on_an_unreachable_postgresql_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A store that cannot be reached: exit status 1, the classed error with
    the first line of its cause, and never the DSN's password."""
    status, _ = run("runs", "list", f"postgresql://nobody:s3cret-pw@127.0.0.1:{_closed_port()}/x")
    err = capsys.readouterr().err
    assert status == 1
    assert "storage_failed: PostgreSQL store failed (OperationalError:" in err
    assert "s3cret-pw" not in err


def _closed_stdout(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """The entry point with standard output a pipe whose reader is gone."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "trio_backplane.cli", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            check=False,
            timeout=120,
        )
    finally:
        os.close(write)


def test_a_closed_stdout_exits_quietly(demo_store: tuple[Path, str, str], tmp_path: Path) -> None:
    """A reader that went away (``backplane runs list DB | head -0``): exit
    status 141 (128 + SIGPIPE), no traceback, no "Exception ignored" at exit."""
    db, approved, _ = demo_store
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"name": "a", "inputSchema": {"type": "object"}}]))
    for argv in (
        ("runs", "list", str(db), "--json"),
        ("runs", "show", str(db), approved, "--json"),
        ("runs", "show", str(db), approved),
        ("catalog", "admit", str(tools)),
    ):
        done = _closed_stdout(*argv)
        assert (done.returncode, done.stderr) == (141, b""), argv


def test_a_run_id_that_is_not_utf8_is_a_usage_error(demo_store: tuple[Path, str, str]) -> None:
    """A run id that is not UTF-8 (``$'caf\\xe9'``): a one-line usage error."""
    db, _, _ = demo_store
    for command in ("show", "recover"):
        done = subprocess.run(
            [sys.executable, "-m", "trio_backplane.cli", "runs", command, str(db), b"caf\xe9"],
            capture_output=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert done.stdout == b""
        assert done.stderr.count(b"\n") == 1
        assert b"UTF-8" in done.stderr
        assert b"Traceback" not in done.stderr


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_runs_list_names_the_runs_it_cannot_read_and_lists_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged run, or one a newer trio_backplane wrote, no longer hides
    every other: the listing shows each run from its summary, says on
    standard error which run cannot be read and why (its class, the run,
    the versions), and exits 1; ``runs show`` of such a run names it."""
    db = tmp_path / "runs.db"
    trio.run(unreadable_runs, db)
    status, text = run("runs", "list", str(db), "--json")
    err = capsys.readouterr().err.splitlines()
    assert status == 1
    rows = {row["run_id"]: row for row in json.loads(text)}
    assert rows["good"] == {
        "run_id": "good", "state": "queued", "incarnation": 1, "revision": 0,
        "work": "0/10", "messages": 0,
    }  # fmt: skip
    assert (rows["broken"]["work"], rows["broken"]["messages"]) == (None, None)
    assert rows["broken"]["unreadable"].startswith("storage_failed: stored run cannot be decoded")
    assert rows["newer"]["unreadable"] == (
        "unsupported_capability: stored record was written by a newer trio_backplane"
        f" run_id=newer path={db} schema_version=99 supported={SCHEMA_VERSION}"
    )
    assert err == [
        f"backplane: {rows['broken']['unreadable']}",
        f"backplane: {rows['newer']['unreadable']}",
    ]
    status, text = run("runs", "list", str(db))
    assert status == 1
    assert "3 runs" in text
    assert len(capsys.readouterr().err.splitlines()) == 2
    status, text = run("runs", "show", str(db), "newer")
    assert (status, text) == (1, "")
    assert "run_id=newer" in capsys.readouterr().err


def test_runs_refuse_a_file_that_is_not_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another application's SQLite file, a 0-byte file or a file that is not
    SQLite at all: every ``runs`` command refuses it as a usage error (one
    line) and leaves the directory byte for byte as it was (no tables
    added, no switch to WAL, no journal files)."""
    import sqlite3

    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE foo (x)")
    conn.commit()
    conn.close()
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "garbage.db").write_bytes(b"not a database, not at all" * 100)
    before = _snapshot(tmp_path)
    for name in ("other.db", "empty.db", "garbage.db"):
        for argv in (
            ("runs", "list", str(tmp_path / name)),
            ("runs", "show", f"sqlite:///{tmp_path / name}", "r"),
            ("runs", "recover", str(tmp_path / name), "r"),
            ("runs", "recover", str(tmp_path / name), "r", "--fence"),
        ):
            status, out = run(*argv)
            err = capsys.readouterr().err
            assert (status, out) == (2, ""), argv
            assert err.count("\n") == 1, err
            assert "is not a trio_backplane store" in err, err
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "password", ["pa@ss-SECRET1", "p@ss@word-SECRET1", "pa@ss:SECRET1", "pa@ss-SECRET1%21"]
)
def test_a_raw_at_in_the_dsn_password_never_leaks_a_fragment(
    password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A password holding an unescaped ``@``: libpq takes what follows the
    first ``@`` for the host and names it in its error; no fragment of the
    password reaches the output."""
    status, out = run("runs", "list", f"postgresql://u:{password}@127.0.0.1:{_closed_port()}/x")
    err = capsys.readouterr().err
    assert status in (1, 2)
    assert "SECRET1" not in out + err, err
    assert "ss-SEC" not in out + err, err


@pytest.mark.parametrize("password", ["p", "or", "t0"])
def test_a_short_dsn_password_neither_mangles_nor_shows_through_the_error(
    password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A password of one or two characters is hidden where it stands alone,
    not inside every word of the error (which mangled the message and gave
    the password away by its holes)."""
    status, _ = run("runs", "list", f"postgresql://u:{password}@127.0.0.1:{_closed_port()}/x")
    err = capsys.readouterr().err
    assert status in (1, 2)
    assert err.startswith("backplane: "), err
    assert "***" not in err.split("(", 1)[-1].replace("u:***@", ""), err
    assert "connect" in err.lower(), err


def _tools_command(command: str, path: Path) -> tuple[str, ...]:
    if command == "schema":
        return ("schema", "check", str(path))
    return ("catalog", "admit", str(path))


@pytest.mark.parametrize("command", ["schema", "catalog"])
def test_tool_files_nested_too_deeply_are_a_usage_error(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tools file nested past Python's JSON parser is "cannot read tools"
    (exit status 2), not a traceback read as "rejected"."""
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert run(*_tools_command(command, path))[0] == 2
    assert "cannot read tools: JSON nested too deeply" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["schema", "catalog"])
def test_tool_names_are_printed_as_text_never_as_markup_or_escapes(
    tmp_path: Path, command: str
) -> None:
    """A tool name holding rich markup (``a[/b]``, a valid name) is printed
    as plain text, no markup error; ``schema check``, which reports any
    name, drops terminal escapes from it."""
    tools = [{"name": "a[/b]", "inputSchema": {"type": "object"}}]
    if command == "schema":
        tools.append({"name": "x\x1b]0;pwned\x07\x1b[2J", "inputSchema": {"type": "object"}})
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools))
    status, text = run(*_tools_command(command, path))
    assert status == 0
    assert "a[/b]" in text
    assert "\x1b" not in text
    assert "\x07" not in text
    if command == "schema":
        assert "x]0;pwned[2J" in text


def test_demo_interrupted_or_with_its_output_gone_exits_without_a_traceback(
    tmp_path: Path,
) -> None:
    """CAN-18, from the command line: Ctrl-C during the demo exits 130 with
    one line (the run cancelled), a reader closing the output exits 141, and
    an ``--events`` file that cannot be written (a full disk) exits 2 with
    one line once the run is over: never a traceback (each escaped wrapped in
    the conversation's exception group, exit 1)."""
    import signal
    import time

    # Ctrl-C as a terminal delivers it: SIGINT at its default disposition in
    # the child, even when the suite itself runs with SIGINT ignored (a
    # background job of a non-interactive shell), which exec would pass on.
    as_in_a_terminal = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    command = [sys.executable, "-c", as_in_a_terminal, "-m", "trio_backplane.cli", "demo"]
    interrupted = subprocess.Popen(
        [*command, "--approve", "yes", "--db", str(tmp_path / "a.sqlite3"), "--pace", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert interrupted.stdout is not None
    seen = []
    while not (line := interrupted.stdout.readline()).startswith(b"user"):
        assert line, seen  # the prompt is consumed: the run streams, 5 s a word
        seen.append(line)
    time.sleep(0.5)
    interrupted.send_signal(signal.SIGINT)
    out, err = interrupted.communicate(timeout=60)
    assert interrupted.returncode == 130, (err, out[-2000:])
    assert b"interrupted; the run was cancelled" in err
    assert b"Traceback" not in err

    done = _closed_stdout("demo", "--db", str(tmp_path / "b.sqlite3"), "--approve", "yes")
    assert (done.returncode, done.stderr) == (141, b"")

    if not os.path.exists("/dev/full"):  # Linux's: a device whose every write fails
        return
    full = _cli(
        "demo", "--db", str(tmp_path / "c.sqlite3"), "--approve", "yes", "--pace", "0",
        "--events", "/dev/full",
    )  # fmt: skip
    assert full.returncode == 2, full.stderr
    assert "cannot write --events" in full.stderr
    assert "Traceback" not in full.stderr
    assert "run completed" in full.stdout  # the log failing stops no run


def test_runs_commands_that_read_change_nothing_in_the_store(
    demo_store: tuple[Path, str, str], tmp_path: Path
) -> None:
    """STO-12, read-only commands: ``runs list|show|recover`` on a store an
    older trio_backplane wrote (layout 1) or one in rollback-journal mode
    leave the file byte for byte as it was: no layout upgrade (older hosts
    would refuse the file from then on), no switch to WAL.  ``--fence``
    writes, and brings the file to this code's layout first."""
    import shutil
    import sqlite3

    db, approved, _ = demo_store
    for name, change in (
        ("layout1", "UPDATE meta SET value = '1' WHERE key = 'layout_version'"),
        ("rollback", "PRAGMA journal_mode = DELETE"),
    ):
        copy = tmp_path / f"{name}.sqlite3"
        shutil.copy(db, copy)
        conn = sqlite3.connect(copy, isolation_level=None)
        conn.execute(change)
        conn.execute("PRAGMA journal_mode = DELETE")  # the file alone holds it all
        conn.close()
        before = copy.read_bytes()
        for argv in (("list",), ("show", approved), ("recover", approved)):
            status, text = run("runs", argv[0], str(copy), *argv[1:])
            assert status == 0, (name, argv, text)
            assert copy.read_bytes() == before, (name, argv)
    status, text = run("runs", "recover", str(tmp_path / "layout1.sqlite3"), approved, "--fence")
    assert status == 0, text
    conn = sqlite3.connect(tmp_path / "layout1.sqlite3")
    assert conn.execute("SELECT value FROM meta WHERE key = 'layout_version'").fetchone() == ("2",)
    conn.close()


def test_names_holding_a_lone_surrogate_are_printed_escaped(tmp_path: Path) -> None:
    """A tools file may hold a tool name or a property key with a lone
    surrogate (JSON allows ``\\ud800``): each tool is reported, the name
    escaped, and the others are not lost to an encoding error."""
    tools = tmp_path / "tools.json"
    tools.write_text(
        '[{"name": "a\\ud800b", "inputSchema": {"type": "object"}},'
        ' {"name": "ok", "inputSchema": {"type": "object", "properties": {"\\ud800": {}}}}]'
    )
    done = _cli("schema", "check", str(tools))
    assert done.returncode == 0, done.stderr
    assert "a\\ud800b" in done.stdout
    assert "2 tools: 1 accepted, 1 rejected" in done.stdout
    assert "Traceback" not in done.stderr


def test_runs_show_prints_messages_of_any_shape(tmp_path: Path) -> None:
    """A conversation state is the host's own mapping: a tool message whose
    result is text, a message whose content is a number or a mapping are
    shown as they are, never a traceback."""
    db = tmp_path / "runs.sqlite3"
    messages = [
        {"role": "tool", "name": "t", "result": "plain text result"},
        {"role": "assistant", "content": 42},
        {"role": "assistant", "content": {"note": "a mapping"}},
        {"role": "tool", "name": "u", "result": {"is_error": True, "error": {"details": "x"}}},
    ]

    async def odd() -> None:
        async with SQLiteStore(db) as store:
            await store.create(
                RunRecord.new("odd", context={"conversation": {}}, transcript=messages)
            )

    trio.run(odd)
    status, text = run("runs", "show", str(db), "odd")
    assert status == 0, text
    for shown in ("plain text result", "42", "a mapping"):
        assert shown in text


@LINUX_ONLY
@pytest.mark.parametrize("approve", ["yes", "no"])
def test_demo_with_commands_runs_a_real_command_under_approval(
    tmp_path: Path, approve: str
) -> None:
    """``demo --commands``: the scripted model runs ``ls`` of the package and
    a ``python -c`` line through ``exec_command``, only once approved; the
    run completes either way and its command session is released."""
    status, text, run_id = _demo(tmp_path, "--commands", "--approve", approve)
    assert status == 0, text
    record = _load(tmp_path / "demo.sqlite3", run_id)
    [result] = [m["result"] for m in thaw(record.transcript) if m.get("name") == "exec_command"]
    if approve == "yes":
        assert result["structured_content"]["exit_code"] == 0
        output = result["structured_content"]["output"]
        assert "__init__.py" in output
        assert re.search(r"^python 3\.\d+\.\d+", output, re.MULTILINE), output
        assert "The command exited 0." in text
    else:
        assert result["is_error"] is True
        assert "The command did not run." in text


def test_console_serves_a_store_on_loopback_until_interrupted(tmp_path: Path) -> None:
    """``backplane console --db`` on a demo's SQLite store: it prints where it
    listens and a sign-in URL, serves the runs page to the token only, and
    exits 0 on Ctrl-C; a host that is not loopback, or a store that is not
    there, is refused."""
    import httpx

    status, text, run_id = _demo(tmp_path, "--approve", "yes")
    assert status == 0, text
    db = tmp_path / "demo.sqlite3"
    server = subprocess.Popen(
        [sys.executable, "-m", "trio_backplane.cli", "console", "--db", str(db), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        listening = server.stdout.readline()
        sign_in = server.stdout.readline().removeprefix("sign in: ").strip()
        assert listening.startswith("backplane console on http://127.0.0.1:"), listening
        with httpx.Client() as client:
            assert client.get(sign_in.split("/login")[0] + "/").status_code == 401
            runs = client.get(sign_in, follow_redirects=True)
            assert runs.status_code == 200
            assert run_id in runs.text
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert "Traceback" not in err
    refused = _cli("console", "--db", str(db), "--host", "0.0.0.0", "--port", "0")
    assert refused.returncode == 1
    assert "loopback only" in refused.stderr
    assert _cli("console", "--db", str(tmp_path / "none.sqlite3")).returncode == 2
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = _cli("console", "--db", str(db), "--port", str(taken.getsockname()[1]))
    assert busy.returncode == 2
    assert "cannot listen there" in busy.stderr
    assert "Traceback" not in busy.stderr
