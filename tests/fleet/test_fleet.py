"""Workers on PostgreSQL: claims, leases, takeover without replay."""

from __future__ import annotations

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
from trio_backplane.fleet import Worker, submit, wait, watch

pytest_plugins = ["tests.store.postgres_fixture"]


def _ledger(dsn: str, schema: str) -> None:
    psycopg: Any = importlib.import_module("psycopg")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        conn.execute(f"CREATE TABLE {schema}.calls (run_id text, invocation_id text, tool text)")


def _calls(dsn: str, schema: str) -> list[tuple[str, str]]:
    psycopg: Any = importlib.import_module("psycopg")
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(f"SELECT run_id, invocation_id FROM {schema}.calls").fetchall()
    return [(r, i) for r, i in rows]


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
    runs the stopped worker held were finished by another worker."""

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
            for run_id in stopped_held:
                # the stopped worker, resumed, committed nothing: after the
                # taker's fence come only the taker's own commits
                # (one it had finished, or not yet created, needed no fence)
                kinds = [e.type for e in await store.events(run_id)]
                if "run.fence" in kinds:
                    fence = kinds.index("run.fence")
                    taker = {"run.cancel", "run.cleanup_settled"}
                    assert set(kinds[fence + 1 :]) <= taker, kinds

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


async def test_a_run_with_nothing_in_flight_is_continued_from_its_transcript(
    pg_dsn: str, pg_schema: str, monkeypatch: Any
) -> None:
    """A worker died while its run waited in a (read-only) provider attempt,
    after a mutating tool had completed: the next worker fences the run,
    settles it ``cancelled`` and continues it as a replacement run fed the
    committed transcript; the tool is never invoked again."""
    from tests.runtime.test_takeover import Dying
    from trio_backplane import open_conversation
    from trio_backplane.fleet._queue import Queue
    from trio_backplane.store import PostgresStore
    from trio_backplane.tools import Authority

    monkeypatch.setenv("FLEET_TEST_DSN", pg_dsn)
    monkeypatch.setenv("FLEET_TEST_SCHEMA", pg_schema)
    await trio.to_thread.run_sync(_ledger, pg_dsn, pg_schema)
    run_id = await submit(pg_dsn, agent="resumable", prompt="write once", schema=pg_schema)
    queue = Queue(pg_dsn, schema=pg_schema)
    ghost = await trio.to_thread.run_sync(queue.claim, "ghost", 0.5, None)
    assert ghost is not None
    spec = await app.spec("resumable", run_id)
    async with PostgresStore(pg_dsn, schema=pg_schema) as inner:
        store = Dying(inner)
        async with open_conversation(
            run_id,
            store=store,
            provider=spec.provider,
            registry=spec.registry,
            authority=Authority.for_registry(spec.registry, caller="ghost", run_id=run_id),
        ) as conversation:
            await conversation.prompt("write once")
            while True:  # the tool's result committed, the next attempt under way
                record = await inner.load(run_id)
                if record is not None and record.active_provider and len(record.transcript) > 2:
                    break
                await trio.sleep(0.01)
            store.dead = True  # the ghost's host is gone
            await conversation.cancel()
        first = await inner.load(run_id)
        worker = Worker(pg_dsn, app, schema=pg_schema, worker_id="taker", lease=2.0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            status = await wait(pg_dsn, run_id, schema=pg_schema, timeout=60)
            worker.drain()
        second = await inner.load(status["current_run"])
    queue.close()
    assert (status["outcome"], status["claims"], status["current_run"]) == (
        "completed",
        2,
        f"{run_id}#2",
    )
    assert first is not None
    assert second is not None
    settled = await _load(pg_dsn, pg_schema, run_id)
    assert (settled.state, settled.stop_reason) == ("cancelled", "recovered")
    earlier = list(first.transcript)
    assert list(second.transcript)[: len(earlier)] == earlier
    calls = await trio.to_thread.run_sync(_calls, pg_dsn, pg_schema)
    assert [run for run, _ in calls] == [run_id]  # the write ran once, never replayed


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


async def test_a_run_waiting_for_a_person_frees_its_slot_past_the_idle_bound(
    pg_dsn: str, pg_schema: str, monkeypatch: Any
) -> None:
    """With one slot, a run waiting for approval past ``idle_bound`` no
    longer holds it: the next run is claimed and completes meanwhile; the
    answer, given later from another task, still reaches the waiting run."""
    from trio_backplane.fleet import pending, resolve

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
        await resolve(pg_dsn, waiting, asked["id"], "approved", schema=pg_schema)
        second = await wait(pg_dsn, waiting, schema=pg_schema, timeout=30)
        worker.drain()
    assert (first["outcome"], second["outcome"]) == ("completed", "completed")


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
