"""The console over HTTP (no browser): sign-in, the runs and run pages,
escaping, secrets, live events, and answers refused or taken."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.console.support import CANARY, Deploy, served, waiting_run
from tests.store.unreadable import RUNS, unreadable_runs
from trio_backplane import Error, ErrorClass
from trio_backplane.console import Console, serve
from trio_backplane.kernel import Admit, RunRecord, transition
from trio_backplane.store import MemoryStore, SQLiteStore


async def _signed_in(client: httpx.AsyncClient, console: Console) -> None:
    response = await client.get(console.login_path())
    assert response.status_code == 303
    page = await client.get("/")  # sets the session cookie the CSRF token binds to
    assert page.status_code == 200


def _csrf(html: str) -> str:
    marker = 'name="csrf" value="'
    return html[html.index(marker) + len(marker) :].split('"', 1)[0]


async def test_every_page_needs_the_token(tmp_path: Path) -> None:
    """Without the token: 401 everywhere; a wrong token signs nobody in."""
    async with (
        SQLiteStore(tmp_path / "runs.sqlite3") as store,
        served(store) as s,
        httpx.AsyncClient(base_url=s.url) as client,
    ):
        for path in ("/", "/runs/x", "/events/x"):
            assert (await client.get(path)).status_code == 401, path
        assert (await client.get("/login?token=wrong-token-wrong")).status_code == 401
        assert (await client.get("/")).status_code == 401
        bearer = {"Authorization": f"Bearer {s.console.token}"}
        assert (await client.get("/", headers=bearer)).status_code == 200


async def test_answers_refused_without_token_or_csrf_change_nothing(tmp_path: Path) -> None:
    """An answer without the token (401), with no or a wrong CSRF token
    (403), or to a question the run no longer waits on (409) changes
    nothing; the right one approves, and the run completes."""
    deploy = Deploy()
    async with (
        SQLiteStore(tmp_path / "runs.sqlite3") as store,
        served(store) as s,
        waiting_run(s, "run-a", deploy) as conversation,
    ):
        asked = conversation.status().pending_interaction["id"]
        async with httpx.AsyncClient(base_url=s.url) as client:
            form = {"interaction_id": asked, "answer": "approved"}
            assert (await client.post("/answer/run-a", data=form)).status_code == 401
            await _signed_in(client, s.console)
            page = await client.get("/runs/run-a")
            csrf = _csrf(page.text)
            for bad in ({}, {"csrf": "0" * 64}, {"csrf": csrf[:-1] + "x"}):
                refused = await client.post("/answer/run-a", data={**form, **bad})
                assert refused.status_code == 403
            stale = {"interaction_id": "nope", "answer": "approved", "csrf": csrf}
            assert (await client.post("/answer/run-a", data=stale)).status_code == 409
            assert deploy.calls == []
            assert conversation.status().pending_interaction["id"] == asked
            taken = await client.post("/answer/run-a", data={**form, "csrf": csrf})
            assert taken.status_code == 303
            with trio.fail_after(10):
                snapshot = await conversation.wait_settled()
            assert snapshot.run.state == "completed"
            assert deploy.calls == [{"target": "prod"}]
            again = await client.post("/answer/run-a", data={**form, "csrf": csrf})
            assert again.status_code == 409  # no longer pending


async def test_pages_escape_markup_and_show_no_secret(tmp_path: Path) -> None:
    """A tool result holding ``<script>`` is text on the page; the canary in
    ``provider_context`` is in no page nor event; the pending question
    shows the tool, its arguments and their digest."""
    deploy = Deploy()
    async with SQLiteStore(tmp_path / "runs.sqlite3") as store, served(store) as s:
        arguments = {"target": "<img src=x onerror=alert(1)>"}
        async with (
            waiting_run(s, "run-x", deploy, arguments=arguments) as conversation,
            httpx.AsyncClient(base_url=s.url) as client,
        ):
            await _signed_in(client, s.console)
            waiting = (await client.get("/runs/run-x")).text
            assert "Waiting for a person: permission" in waiting
            assert "&lt;img src=x onerror=alert(1)&gt;" in waiting
            assert "<img src=x" not in waiting
            digest = conversation.status().pending_interaction["request"]["operation"]
            assert digest["arguments_digest"] in waiting
            await conversation.resolve(
                digest and conversation.status().pending_interaction["id"], "approved"
            )
            await conversation.wait_settled()
            pages = [(await client.get(p)).text for p in ("/", "/runs/run-x")]
            events = (await client.get("/events/run-x")).text
        assert deploy.calls
        run_page = pages[1]
        assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in run_page
        assert "<script>window.pwned" not in run_page
        assert "<b>bold</b>" not in run_page
        for text in (*pages, events):
            assert CANARY not in text


async def test_runs_page_filters_pages_and_orders_newest_first(tmp_path: Path) -> None:
    """Runs newest first; a state filter; pages of ``page_size``; an
    unknown state is refused."""
    deploy = Deploy()
    async with (
        SQLiteStore(tmp_path / "runs.sqlite3") as store,
        served(store, page_size=2) as s,
    ):
        for run_id in ("first", "second", "third"):
            async with waiting_run(s, run_id, deploy) as conversation:
                if run_id == "second":  # completed; the others cancelled
                    await conversation.resolve(
                        conversation.status().pending_interaction["id"], "approved"
                    )
                    await conversation.wait_settled()
                else:
                    await conversation.cancel()
                await trio.sleep(0.01)  # admission instants apart
        async with httpx.AsyncClient(base_url=s.url) as client:
            await _signed_in(client, s.console)
            first_page = (await client.get("/")).text
            assert first_page.index("third") < first_page.index("second")
            assert "first" not in first_page.split('id="runs"', 1)[1].split("</table>", 1)[0]
            assert "page 1 of 2" in first_page
            assert "first" in (await client.get("/?page=2")).text
            cancelled = (await client.get("/?state=cancelled")).text
            assert "third" in cancelled
            assert "second</a>" not in cancelled
            assert (await client.get("/?state=nonsense")).status_code == 400


class Reads:
    """A store counting the records and event logs read through it."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner, self.loads, self.logs = inner, 0, 0

    async def load(self, run_id: str) -> Any:
        self.loads += 1
        return await self.inner.load(run_id)

    async def events(self, run_id: str, *, after: int = 0) -> Any:
        self.logs += 1
        return await self.inner.events(run_id, after=after)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_the_runs_page_reads_only_the_records_it_shows() -> None:
    """The runs page orders runs by ``RunSummary.admitted_at``: showing a
    page of 10 out of 40 runs reads those 10 records and no event log."""
    store = Reads(MemoryStore())
    for n in range(40):
        record = RunRecord.new(f"run-{n:02d}")
        await store.create(record)
        admitted, events = transition(record, Admit(at=1_000.0 + n, state="running"))
        await store.commit(
            record.run_id, incarnation=1, expected_revision=0, record=admitted, events=events
        )
    async with served(store, page_size=10) as s, httpx.AsyncClient(base_url=s.url) as client:
        await _signed_in(client, s.console)  # (the first page)
        page = (await client.get("/?page=2")).text
    assert (store.loads, store.logs) == (20, 0)
    shown = page.split('id="runs"', 1)[1].split("</table>", 1)[0]
    assert [f"run-{n:02d}" in shown for n in (29, 20, 19, 30)] == [True, True, False, False]
    assert shown.index("run-29") < shown.index("run-20")  # newest first


async def test_a_run_that_cannot_be_read_is_shown_as_such_and_hides_no_other(
    tmp_path: Path,
) -> None:
    """A run whose rows are damaged, or that a newer trio_backplane wrote,
    is listed from its summary with why it cannot be read, the other runs
    as usual; its own page says so (500), naming the run."""
    path = tmp_path / "runs.sqlite3"
    await unreadable_runs(path)
    async with (
        SQLiteStore(path) as store,
        served(store) as s,
        httpx.AsyncClient(base_url=s.url) as client,
    ):
        await _signed_in(client, s.console)
        listing = await client.get("/")
        newer = await client.get("/runs/newer")
        good = await client.get("/runs/good")
    assert listing.status_code == 200
    rows = listing.text.split('id="runs"', 1)[1].split("</table>", 1)[0].split('<tr class="run">')
    by_run = {run_id: row for row in rows[1:] for run_id in RUNS if f">{run_id}</a>" in row}
    assert "cannot be read" not in by_run["good"]
    assert "0/10" in by_run["good"]
    assert "cannot be read: storage_failed: stored run cannot be decoded" in by_run["broken"]
    assert (
        "cannot be read: unsupported_capability: stored record was written by a newer"
        " trio_backplane" in by_run["newer"]
    )
    assert newer.status_code == 500
    assert "run &#39;newer&#39;: unsupported_capability" in newer.text
    assert good.status_code == 200


async def test_live_events_resume_after_the_last_one_seen(tmp_path: Path) -> None:
    """The event stream sends each stored event with its sequence as ``id``,
    from ``Last-Event-ID`` on, and ends once the run is terminal."""
    deploy = Deploy()
    async with SQLiteStore(tmp_path / "runs.sqlite3") as store, served(store) as s:
        async with waiting_run(s, "run-e", deploy) as conversation:
            await conversation.resolve(conversation.status().pending_interaction["id"], "approved")
            await conversation.wait_settled()
        stored = await store.events("run-e")
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as client:
            await _signed_in(client, s.console)
            whole = _sse((await client.get("/events/run-e")).text)
            resumed = _sse((await client.get("/events/run-e", headers={"Last-Event-ID": "3"})).text)
    ids = [int(e["id"]) for e in whole if e.get("event") == "stored"]
    assert ids == [e.sequence for e in stored]
    assert whole[-1]["event"] == "end"
    assert [int(e["id"]) for e in resumed if e.get("event") == "stored"] == ids[3:]
    first = json.loads(whole[1]["data"])
    assert first["type"] == stored[0].type


def _sse(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, Any] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            fields[name] = value
        if fields:
            events.append(fields)
    return events


async def test_serve_refuses_a_host_that_is_not_loopback(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        with pytest.raises(Error) as refused:
            await serve(Console(store), host="0.0.0.0", port=0)
    assert refused.value.error_class is ErrorClass.FORBIDDEN
    with pytest.raises(Error):
        Console(None, token="short")


async def test_hostile_run_ids_and_sequences_are_refused_not_crashed(tmp_path: Path) -> None:
    """Ids no run can have (empty, NUL, too long) are 404 pages, not server
    errors; a run whose id ends in ``/events`` has its own page; a
    sequence past any real one resumes nothing instead of failing."""
    deploy = Deploy()
    async with (
        SQLiteStore(tmp_path / "runs.sqlite3") as store,
        served(store) as s,
        httpx.AsyncClient(base_url=s.url, timeout=10) as client,
    ):
        await _signed_in(client, s.console)
        for path in ("/runs/", "/runs/%00", "/runs/" + "x" * 300, "/events/", "/events/%00"):
            assert (await client.get(path)).status_code == 404, path
        assert (await client.post("/answer/%00", data={})).status_code == 403  # no CSRF first
        async with waiting_run(s, "a/events", deploy) as conversation:
            page = await client.get("/runs/a/events")
            assert page.status_code == 200
            assert "Waiting for a person" in page.text
            await conversation.cancel()
            await conversation.wait_settled()
        huge = {"Last-Event-ID": "1" + "0" * 30}
        tail = _sse((await client.get("/events/a/events", headers=huge)).text)
        assert [e.get("event") for e in tail if e.get("event")] == ["end"]


async def test_fleet_answers_go_to_the_row_that_runs_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run answered through the fleet goes to the queue row whose current
    run it is: its own row, or a replacement's (``<row>#<n>``) checked;
    never a row that merely shares the prefix of a ``#`` in an id."""
    from trio_backplane import fleet
    from trio_backplane.console import FleetAnswers
    from trio_backplane.fleet import _queue

    rows = {"deploy": "deploy", "job": "job#2", "deploy#prod": "deploy#prod"}
    sent: list[tuple[str, str]] = []

    class Rows:
        def __init__(self, dsn: str, *, schema: str) -> None:
            pass

        def __enter__(self) -> Rows:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def status(self, row: str) -> dict[str, Any] | None:
            return {"current_run": rows[row]} if row in rows else None

    async def resolve(dsn: str, row: str, interaction_id: str, answer: Any, **_: Any) -> None:
        sent.append((row, interaction_id))

    monkeypatch.setattr(_queue, "Queue", Rows)
    monkeypatch.setattr(fleet, "resolve", resolve)
    answers = FleetAnswers("postgresql://db/x")
    await answers("deploy#prod", "i-1", "approved")
    await answers("job#2", "i-2", "approved")
    with pytest.raises(Error) as refused:
        await answers("deploy#staging", "i-3", "approved")  # row "deploy" runs "deploy"
    assert refused.value.error_class is ErrorClass.NOT_FOUND
    assert sent == [("deploy#prod", "i-1"), ("job", "i-2")]
    assert "postgresql" not in repr(answers)
