"""Workers on PostgreSQL: claims, leases, takeover without replay."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import trio

from tests.fleet.app import app
from trio_backplane import Error
from trio_backplane.fleet import Worker, submit, wait, watch

pytest_plugins = ["tests.store.postgres_fixture"]


def _ledger(dsn: str, schema: str) -> None:
    psycopg: Any = importlib.import_module("psycopg")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.calls (run_id text, invocation_id text, tool text,"
            " incarnation integer)"
        )


def _calls(dsn: str, schema: str) -> list[tuple[str, str]]:
    return [(run, invocation) for run, invocation, _ in _ledger_rows(dsn, schema)]


def _ledger_rows(dsn: str, schema: str) -> list[tuple[str, str, int]]:
    """Every recorded invocation: run, invocation id, incarnation."""
    psycopg: Any = importlib.import_module("psycopg")
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT run_id, invocation_id, incarnation FROM {schema}.calls"
        ).fetchall()
    return [(r, i, n) for r, i, n in rows]


async def test_two_workers_share_the_queue_and_finish_every_run(
    pg_dsn: str, pg_schema: str, monkeypatch: Any
) -> None:
    """Runs submitted from one host are claimed by two workers (each run by
    exactly one) and each completes with its tool invoked once."""
    monkeypatch.setenv("FLEET_TEST_DSN", pg_dsn)
    monkeypatch.setenv("FLEET_TEST_SCHEMA", pg_schema)
    await trio.to_thread.run_sync(_ledger, pg_dsn, pg_schema)
    run_ids = [
        await submit(pg_dsn, agent="writer", prompt=f"task {n}", schema=pg_schema)
        for n in range(12)
    ]
    workers = [
        Worker(pg_dsn, app, schema=pg_schema, concurrency=3, worker_id=f"w{n}", lease=5.0)
        for n in range(2)
    ]
    async with trio.open_nursery() as nursery:
        for worker in workers:
            nursery.start_soon(worker.run)
        results = [await wait(pg_dsn, run_id, schema=pg_schema, timeout=60) for run_id in run_ids]
        for worker in workers:
            worker.drain()
    assert [r["outcome"] for r in results] == ["completed"] * 12
    assert all(r["claims"] == 1 for r in results)
    calls = await trio.to_thread.run_sync(_calls, pg_dsn, pg_schema)
    assert sorted(run for run, _ in calls) == sorted(run_ids)
    assert len(set(calls)) == 12  # one invocation a run, none twice
    assert {r["worker"] for r in results} <= {"w0", "w1"}
    events = [event async for event in watch(pg_dsn, run_ids[0], schema=pg_schema)]
    assert events[0].type == "run.admit"
    assert events[-1].payload["state"] == "completed"
    assert [e.type for e in events].count("run.tool_invoked") == 1


def _env(pg_dsn: str, pg_schema: str, **more: str) -> dict[str, str]:
    """A worker process's environment: the ledger the test app writes to."""
    ledger = {"FLEET_TEST_DSN": pg_dsn, "FLEET_TEST_SCHEMA": pg_schema}
    return {**os.environ, **ledger, "PYTHONPATH": os.getcwd(), **more}


def _worker_process(
    pg_dsn: str, pg_schema: str, name: str, env: dict[str, str], *options: str
) -> subprocess.Popen[bytes]:
    """``backplane worker`` of the test app, in a process of its own."""
    command = [sys.executable, "-m", "trio_backplane.cli", "worker", "--db", pg_dsn]
    command += ["--app", "tests.fleet.app", "--schema", pg_schema, "--worker-id", name]
    return subprocess.Popen([*command, *options], env=env, stdout=subprocess.DEVNULL)


def _held_by(dsn: str, schema: str, worker: str) -> list[str]:
    psycopg: Any = importlib.import_module("psycopg")
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT run_id FROM {schema}.backplane_fleet WHERE worker = %s AND state = 'claimed'",
            (worker,),
        ).fetchall()
    return [r for (r,) in rows]


def test_a_killed_and_a_stopped_worker_lose_their_runs_but_nothing_is_replayed(
    pg_dsn: str, pg_schema: str, tmp_path: Any
) -> None:
    """300 runs, three worker processes; one is SIGKILLed mid-run, another SIGSTOPped
    past its lease and resumed: every run is finished (terminal, or parked
    for a reconciler), no invocation of the mutating tool is recorded twice
    for one intent, each ``unknown_outcome`` names its evidence, and the
    runs the stopped worker held were finished by another worker, and no
    invocation was dispatched without its intent committed (so the stopped
    worker, resumed and fenced, dispatched nothing)."""

    from trio_backplane.store import PostgresStore

    _ledger(pg_dsn, pg_schema)
    env = _env(pg_dsn, pg_schema, FLEET_TEST_TOOL_SLEEP="0.3")
    lease = 1.5

    async def submit_all() -> list[str]:
        return [
            await submit(pg_dsn, agent="writer", prompt=f"task {n}", schema=pg_schema)
            for n in range(300)
        ]

    run_ids = trio.run(submit_all)
    options = ("--lease", str(lease), "--concurrency", "4")
    workers = [_worker_process(pg_dsn, pg_schema, f"w{n}", env, *options) for n in range(3)]
    try:
        deadline = time.monotonic() + 60
        while len(_calls(pg_dsn, pg_schema)) < 8:
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.05)
        workers[0].send_signal(signal.SIGKILL)
        while not _held_by(pg_dsn, pg_schema, "w1"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        workers[1].send_signal(signal.SIGSTOP)
        stopped_held = _held_by(pg_dsn, pg_schema, "w1")
        time.sleep(3 * lease)
        workers[1].send_signal(signal.SIGCONT)

        async def wait_all() -> list[dict[str, Any]]:
            return [await wait(pg_dsn, r, schema=pg_schema, timeout=120) for r in run_ids]

        results = trio.run(wait_all)
    finally:
        for worker in workers[1:]:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=40)
            except subprocess.TimeoutExpired:
                worker.kill()
    by_run = dict(zip(run_ids, results, strict=True))
    assert {r["state"] for r in results} <= {"done", "parked"}
    calls = _calls(pg_dsn, pg_schema)
    assert len(calls) == len(set(calls)), "a mutating invocation was recorded twice"
    taken_over = [r for r in results if r["claims"] > 1]
    assert taken_over, "nothing was taken over: the test killed too late"
    for run_id in stopped_held:
        assert by_run[run_id]["claims"] > 1  # another worker finished it

    async def evidence() -> None:
        async with PostgresStore(pg_dsn, schema=pg_schema) as store:
            for row in results:
                record = await store.load(row["current_run"])
                if row["outcome"] == "unknown_outcome":
                    assert record is not None
                    assert record.outcome["evidence"], row
            # every recorded invocation had its intent committed first (the
            # stopped worker, resumed, met the taker's fence at its next
            # commit, the intent before any dispatch): none without one
            for run, invocation, incarnation in _ledger_rows(pg_dsn, pg_schema):
                record = await store.load(run)
                assert record is not None
                intent = record.intents.get(f"tool:{invocation}")
                assert intent is not None, (run, invocation, incarnation)

    trio.run(evidence)


def test_an_approval_is_answered_from_another_process(pg_dsn: str, pg_schema: str) -> None:
    """A run waiting for approval on a worker process is approved with
    ``backplane runs resolve`` from another process, and completes."""

    from trio_backplane.fleet import pending

    _ledger(pg_dsn, pg_schema)
    env = _env(pg_dsn, pg_schema)
    run_id = trio.run(lambda: submit(pg_dsn, agent="approver", prompt="ship", schema=pg_schema))
    worker = _worker_process(pg_dsn, pg_schema, "a", env)
    try:
        deadline = time.monotonic() + 60
        waiting = None
        while waiting is None:
            assert time.monotonic() < deadline, "the run never asked for approval"
            time.sleep(0.05)
            waiting = trio.run(lambda: pending(pg_dsn, run_id, schema=pg_schema))
        assert waiting["request"]["kind"] == "permission"
        assert waiting["request"]["operation"]["tool_name"] == "deploy"
        assert _calls(pg_dsn, pg_schema) == []  # nothing ran before the answer
        resolved = subprocess.run(
            [
                sys.executable,
                "-m",
                "trio_backplane.cli",
                "runs",
                "resolve",
                pg_dsn,
                run_id,
                waiting["id"],
                "approved",
                "--schema",
                pg_schema,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert resolved.returncode == 0, resolved.stderr
        watched = subprocess.run(
            [sys.executable, "-m", "trio_backplane.cli", "runs", "watch", pg_dsn, run_id,
             "--schema", pg_schema],
            env=env, capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        status = trio.run(lambda: wait(pg_dsn, run_id, schema=pg_schema, timeout=60))
    finally:
        worker.terminate()
        worker.wait(timeout=40)
    assert status["outcome"] == "completed"
    assert [run for run, _ in _calls(pg_dsn, pg_schema)] == [run_id]
    lines = [json.loads(line) for line in watched.stdout.splitlines()]
    assert lines[0]["type"] == "run.admit"
    assert lines[-1]["state"] == "completed"  # it followed the run to its end


async def _ghost(dsn: str, schema: str, agent: str, last: Any) -> tuple[str, Any]:
    """A worker ('ghost') claims a run of ``agent`` (prompt "go") and its
    host dies right after the commit that leaves a record ``last`` holds
    for: its lease lapses (0.5 s) with what it left stored.  The run id and
    that record."""
    from tests.runtime.test_resume import DiesAfter
    from trio_backplane import open_conversation
    from trio_backplane.fleet._queue import Queue
    from trio_backplane.store import PostgresStore
    from trio_backplane.tools import Authority

    run_id = await submit(dsn, agent=agent, prompt="go", schema=schema)
    with Queue(dsn, schema=schema) as queue:
        assert await trio.to_thread.run_sync(queue.claim, "ghost", 0.5, None) is not None
    spec = await app.spec(agent, run_id)
    async with PostgresStore(dsn, schema=schema) as inner:
        store = DiesAfter(inner, last)
        async with open_conversation(
            run_id,
            store=store,
            provider=spec.provider,
            registry=spec.registry,
            authority=Authority.for_registry(spec.registry, caller="ghost", run_id=run_id),
            run_timeout=spec.run_timeout,
        ) as conversation:
            with contextlib.suppress(Error):  # its host may die as the prompt commits
                await conversation.prompt("go")
            while not store.dead:
                await trio.sleep(0.01)
        return run_id, await inner.load(run_id)


async def _taken_over(dsn: str, schema: str, run_id: str, answer: Any = None) -> Any:
    """A worker takes the ghost's run over; ``answer``: what a person
    answers once the run asks again.  The row's final status."""
    from trio_backplane.fleet import pending, resolve

    worker = Worker(dsn, app, schema=schema, worker_id="taker", lease=2.0, poll_interval=0.05)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run)
        if answer is not None:
            with trio.fail_after(30):
                while (asked := await pending(dsn, run_id, schema=schema)) is None or (
                    (await _load(dsn, schema, run_id)).incarnation == 1
                ):
                    await trio.sleep(0.05)
            await resolve(dsn, run_id, asked["id"], answer, schema=schema)
        status = await wait(dsn, run_id, schema=schema, timeout=60)
        worker.drain()
    return status


async def test_a_run_with_nothing_in_flight_is_resumed_where_it_stopped(
    pg_dsn: str, pg_schema: str, monkeypatch: Any
) -> None:
    """A worker died while its run waited in a (read-only) provider attempt,
    after a mutating tool had completed: the next worker fences the run and
    resumes it on its own incarnation (the interrupted attempt abandoned);
    the tool is never invoked again."""
    monkeypatch.setenv("FLEET_TEST_DSN", pg_dsn)
    monkeypatch.setenv("FLEET_TEST_SCHEMA", pg_schema)
    await trio.to_thread.run_sync(_ledger, pg_dsn, pg_schema)

    def second_attempt(record: Any) -> bool:
        return record.active_provider is not None and len(record.transcript) > 2

    run_id, first = await _ghost(pg_dsn, pg_schema, "resumable", second_attempt)
    status = await _taken_over(pg_dsn, pg_schema, run_id)
    assert (status["outcome"], status["claims"], status["current_run"]) == (
        "completed",
        2,
        run_id,
    )
    resumed = await _load(pg_dsn, pg_schema, run_id)
    assert resumed.incarnation == 2
    abandoned = f"provider:{first.active_provider['attempt_id']}"
    assert resumed.intents[abandoned]["status"] == "consumed"
    earlier = list(first.transcript)
    assert list(resumed.transcript)[: len(earlier)] == earlier
    assert resumed.transcript[-1]["content"] == "finished after takeover"
    calls = await trio.to_thread.run_sync(_calls, pg_dsn, pg_schema)
    assert [run for run, _ in calls] == [run_id]  # the write ran once, never replayed


async def test_a_run_waiting_for_approval_on_a_dead_worker_resumes_with_its_pre_wait_budget(
    pg_dsn: str, pg_schema: str, monkeypatch: Any
) -> None:
    """A worker died while its run waited for a person's approval: the
    next worker resumes it, asking again under the same interaction id,
    with the run time it had left when the wait began (the time the run
    sat without a worker does not count); approved then, the tool runs
    once and the run completes."""
    monkeypatch.setenv("FLEET_TEST_DSN", pg_dsn)
    monkeypatch.setenv("FLEET_TEST_SCHEMA", pg_schema)
    await trio.to_thread.run_sync(_ledger, pg_dsn, pg_schema)

    def asked(record: Any) -> bool:
        conversation = record.context.get("conversation")
        return bool(conversation and conversation.get("pending_interaction"))

    run_id, first = await _ghost(pg_dsn, pg_schema, "approver", asked)
    question = first.context["conversation"]["pending_interaction"]
    await trio.sleep(1.0)  # the run sits without a worker
    status = await _taken_over(pg_dsn, pg_schema, run_id, answer="approved")
    assert (status["outcome"], status["current_run"]) == ("completed", run_id)
    from trio_backplane.store import PostgresStore

    async with PostgresStore(pg_dsn, schema=pg_schema) as store:
        events = await store.events(run_id)
        final = await store.load(run_id)
    assert final is not None
    fence = next(e for e in events if e.type == "run.fence")
    moved = next(
        e
        for e in events
        if e.sequence > fence.sequence and "execution_deadline" in e.payload["input"]
    )
    deadline = moved.payload["input"]["execution_deadline"]
    # the resumed deadline: what was left when the wait began, from the resumption
    assert fence.occurred_at + question["remaining"] <= deadline
    assert deadline <= moved.occurred_at + question["remaining"]
    asked_again = final.context["conversation"]["resolved_interaction"]
    assert asked_again["interaction_id"] == question["id"]
    assert [run for run, _ in await trio.to_thread.run_sync(_calls, pg_dsn, pg_schema)] == [run_id]


async def _load(dsn: str, schema: str, run_id: str) -> Any:
    from trio_backplane.store import PostgresStore

    async with PostgresStore(dsn, schema=schema) as store:
        return await store.load(run_id)


async def test_a_run_that_keeps_failing_is_parked_not_retried_forever(
    pg_dsn: str, pg_schema: str
) -> None:
    """A run whose attempts fail (here its agent's factory raises) does not
    end the worker; each failure is noted on its row, and past
    ``max_claims`` it is parked for a reconciler."""
    run_id = await submit(pg_dsn, agent="broken", prompt="go", schema=pg_schema)
    worker = Worker(pg_dsn, app, schema=pg_schema, lease=0.3, max_claims=2, worker_id="w")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run)
        status = await wait(pg_dsn, run_id, schema=pg_schema, timeout=60)
        worker.drain()
    assert (status["state"], status["outcome"], status["claims"]) == (
        "parked",
        "claimed 3 times",
        3,
    )


def _from_a_newer_version(dsn: str, schema: str, run_id: str) -> None:
    """Mark ``run_id``'s stored record as a later record schema's."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        runs = f'"{schema}".runs'
        (head,) = conn.execute(f"SELECT head FROM {runs} WHERE run_id = %s", (run_id,)).fetchone()
        head = json.loads(head)
        head["schema_version"] = 99
        conn.execute(f"UPDATE {runs} SET head = %s WHERE run_id = %s", (json.dumps(head), run_id))


async def test_a_run_that_cannot_be_read_is_parked_saying_why(pg_dsn: str, pg_schema: str) -> None:
    """A run whose record this version cannot read (here a newer
    trio_backplane's) fails each claim, noted on its row, and past
    ``max_claims`` is parked with the reason, not claimed for ever."""
    from trio_backplane.kernel import RunRecord
    from trio_backplane.store import PostgresStore

    run_id = await submit(pg_dsn, agent="writer", prompt="go", schema=pg_schema)
    async with PostgresStore(pg_dsn, schema=pg_schema) as store:
        await store.create(RunRecord.new(run_id, work=10))
    await trio.to_thread.run_sync(_from_a_newer_version, pg_dsn, pg_schema, run_id)
    worker = Worker(pg_dsn, app, schema=pg_schema, lease=0.3, max_claims=2, worker_id="w")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run)
        status = await wait(pg_dsn, run_id, schema=pg_schema, timeout=60)
        worker.drain()
    assert (status["state"], status["claims"]) == ("parked", 3)
    assert status["outcome"] == (
        "claimed 3 times; the run cannot be read: unsupported_capability:"
        " stored record was written by a newer trio_backplane"
    )


async def test_a_run_waiting_for_a_person_is_released_past_the_idle_bound(
    pg_dsn: str, pg_schema: str, monkeypatch: Any
) -> None:
    """With one slot, a run waiting for approval past ``idle_bound`` is
    released (its row waits, held by no worker; its worker's incarnation
    fenced): the next run is claimed and completes meanwhile; the answer,
    given later from another task, makes the row claimable again, and the
    run is resumed, approved, and completes with its tool run once."""
    from trio_backplane.fleet import pending, resolve
    from trio_backplane.fleet._queue import Queue

    monkeypatch.setenv("FLEET_TEST_DSN", pg_dsn)
    monkeypatch.setenv("FLEET_TEST_SCHEMA", pg_schema)
    await trio.to_thread.run_sync(_ledger, pg_dsn, pg_schema)
    waiting = await submit(pg_dsn, agent="approver", prompt="ship", schema=pg_schema)
    other = await submit(pg_dsn, agent="writer", prompt="write", schema=pg_schema)
    worker = Worker(
        pg_dsn, app, schema=pg_schema, concurrency=1, idle_bound=0.3, poll_interval=0.05
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run)
        first = await wait(pg_dsn, other, schema=pg_schema, timeout=30)
        asked = await pending(pg_dsn, waiting, schema=pg_schema)
        assert asked is not None  # still waiting while the other run completed
        with Queue(pg_dsn, schema=pg_schema) as queue:
            row = await trio.to_thread.run_sync(queue.status, waiting)
        assert row is not None
        assert (row["state"], row["worker"]) == ("waiting", None)
        await resolve(pg_dsn, waiting, asked["id"], "approved", schema=pg_schema)
        second = await wait(pg_dsn, waiting, schema=pg_schema, timeout=30)
        worker.drain()
    assert (first["outcome"], second["outcome"]) == ("completed", "completed")
    assert second["claims"] == 1  # a release is a clean hand-off, not a failed claim
    record = await _load(pg_dsn, pg_schema, waiting)
    assert record.incarnation == 3  # fenced by the release, then by the resumer
    calls = await trio.to_thread.run_sync(_calls, pg_dsn, pg_schema)
    assert sorted(run for run, _ in calls) == sorted([waiting, other])


async def test_workers_starting_together_create_the_queue_once(pg_dsn: str, pg_schema: str) -> None:
    """Six queues creating the tables at once on a fresh schema (under one
    advisory lock): none fails, and they share one queue."""
    from trio_backplane.fleet._queue import Queue

    queues = [Queue(pg_dsn, schema=pg_schema) for _ in range(6)]
    async with trio.open_nursery() as nursery:
        for queue in queues:
            nursery.start_soon(trio.to_thread.run_sync, queue.ensure)
    assert await trio.to_thread.run_sync(queues[0].counts) == {}
    await submit(pg_dsn, agent="writer", prompt="x", schema=pg_schema)
    assert await trio.to_thread.run_sync(queues[1].counts) == {"queued": 1}
    for queue in queues:
        queue.close()


async def test_a_draining_worker_releases_a_run_waiting_for_approval(
    pg_dsn: str, pg_schema: str, monkeypatch: Any
) -> None:
    """Draining, a worker does not hold a run waiting for a person until its
    drain timeout (nor cancel it past it): it releases it at once, and the
    run, answered later, is resumed by another worker and completes."""
    from trio_backplane.fleet import pending, resolve
    from trio_backplane.fleet._queue import Queue

    monkeypatch.setenv("FLEET_TEST_DSN", pg_dsn)
    monkeypatch.setenv("FLEET_TEST_SCHEMA", pg_schema)
    await trio.to_thread.run_sync(_ledger, pg_dsn, pg_schema)
    run_id = await submit(pg_dsn, agent="approver", prompt="ship", schema=pg_schema)
    first = Worker(
        pg_dsn, app, schema=pg_schema, idle_bound=3600.0, drain_timeout=600.0, poll_interval=0.05
    )
    with trio.fail_after(30):  # the worker ends at once, not at its 600 s drain timeout
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.run)
            while (asked := await pending(pg_dsn, run_id, schema=pg_schema)) is None:
                await trio.sleep(0.05)
            first.drain()
    with Queue(pg_dsn, schema=pg_schema) as queue:
        row = await trio.to_thread.run_sync(queue.status, run_id)
    assert row is not None
    assert (row["state"], row["worker"]) == ("waiting", None)
    assert await trio.to_thread.run_sync(_calls, pg_dsn, pg_schema) == []
    await resolve(pg_dsn, run_id, asked["id"], "approved", schema=pg_schema)
    second = Worker(pg_dsn, app, schema=pg_schema, worker_id="second", poll_interval=0.05)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(second.run)
        status = await wait(pg_dsn, run_id, schema=pg_schema, timeout=30)
        second.drain()
    assert (status["outcome"], status["worker"]) == ("completed", "second")
    assert [run for run, _ in await trio.to_thread.run_sync(_calls, pg_dsn, pg_schema)] == [run_id]


async def test_a_run_the_runtime_cannot_resume_is_replaced_from_its_prompt(
    pg_dsn: str, pg_schema: str, monkeypatch: Any
) -> None:
    """A worker died right after admitting its run, before the first message
    committed: there is no turn to resume, so the taker settles the run and
    replaces it (``<run>#<fencing incarnation>``), starting from the
    submitted prompt; ``watch`` follows both runs, in order."""
    monkeypatch.setenv("FLEET_TEST_DSN", pg_dsn)
    monkeypatch.setenv("FLEET_TEST_SCHEMA", pg_schema)
    await trio.to_thread.run_sync(_ledger, pg_dsn, pg_schema)
    run_id, _ = await _ghost(pg_dsn, pg_schema, "writer", lambda r: r.state == "running")
    status = await _taken_over(pg_dsn, pg_schema, run_id)
    assert (status["outcome"], status["current_run"]) == ("completed", f"{run_id}#2")
    replacement = await _load(pg_dsn, pg_schema, f"{run_id}#2")
    assert replacement.transcript[0]["content"] == "go"  # the submitted prompt
    types = [event.type async for event in watch(pg_dsn, run_id, schema=pg_schema)]
    assert types[:3] == ["run.admit", "run.fence", "run.cancel"]
    assert types[-1] == "run.finish"
    assert [run for run, _ in await trio.to_thread.run_sync(_calls, pg_dsn, pg_schema)] == [
        f"{run_id}#2"
    ]


def test_listening_to_a_database_that_is_away_is_a_classed_storage_failure() -> None:
    """A worker's LISTEN on a database that cannot be reached raises the
    library's ``storage_failed`` (the worker polls meanwhile), never the
    driver's own exception, which would end the worker."""
    import pytest

    from trio_backplane import Error, ErrorClass
    from trio_backplane.fleet._queue import Queue

    dsn = "postgresql://postgres@127.0.0.1:1/none?connect_timeout=1"
    with Queue(dsn) as queue, pytest.raises(Error) as failed:
        queue.listen(0.1)
    assert failed.value.error_class is ErrorClass.STORAGE_FAILED


async def test_the_console_answers_a_fleet_run_through_the_worker_holding_it(
    pg_dsn: str, pg_schema: str, monkeypatch: Any
) -> None:
    """The web console over the fleet's PostgreSQL store: the approval a
    worker's run waits on, answered in the console (token, CSRF), goes
    through ``fleet.resolve`` (committed, the worker woken) and the run
    completes; answering it again is refused (409)."""
    import httpx

    from trio_backplane.console import Console, FleetAnswers, serve
    from trio_backplane.fleet import pending
    from trio_backplane.store import PostgresStore

    monkeypatch.setenv("FLEET_TEST_DSN", pg_dsn)
    monkeypatch.setenv("FLEET_TEST_SCHEMA", pg_schema)
    await trio.to_thread.run_sync(_ledger, pg_dsn, pg_schema)
    run_id = await submit(pg_dsn, agent="approver", prompt="ship", schema=pg_schema)
    worker = Worker(pg_dsn, app, schema=pg_schema, poll_interval=0.05)
    store = PostgresStore(pg_dsn, schema=pg_schema)
    console = Console(store, answer=FleetAnswers(pg_dsn, schema=pg_schema), poll_interval=0.05)
    async with store, trio.open_nursery() as nursery:
        nursery.start_soon(worker.run)
        async with trio.open_nursery() as web:
            url = await web.start(
                lambda task_status: serve(console, port=0, task_status=task_status)
            )
            with trio.fail_after(30):
                while (asked := await pending(pg_dsn, run_id, schema=pg_schema)) is None:
                    await trio.sleep(0.05)
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                await client.get(console.login_path())
                page = (await client.get(f"/runs/{run_id}")).text
                assert asked["id"] in page
                marker = 'name="csrf" value="'
                csrf = page[page.index(marker) + len(marker) :].split('"', 1)[0]
                form = {"interaction_id": asked["id"], "answer": "approved", "csrf": csrf}
                answered = await client.post(f"/answer/{run_id}", data=form)
                assert answered.status_code == 303
                status = await wait(pg_dsn, run_id, schema=pg_schema, timeout=30)
                again = await client.post(f"/answer/{run_id}", data=form)
            web.cancel_scope.cancel()
        worker.drain()  # the worker returns once drained: its connections closed
    assert status["outcome"] == "completed"
    assert again.status_code == 409
    assert [run for run, _ in await trio.to_thread.run_sync(_calls, pg_dsn, pg_schema)] == [run_id]
