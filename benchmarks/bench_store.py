"""How fast do the stores commit, and what does a commit cost late in a run?

    python benchmarks/bench_store.py [--quick]

Workload: one run alternating ``provider_started`` / ``provider_completed``
(the latter appends one message to the transcript), each commit awaited
before the next, as the runtime does.  The kernel transitions are computed
before the clock starts: every store loop commits a precomputed chain of
``(old record, new record, events)`` and only the ``commit`` calls are timed,
as the raw loop writes precomputed rows.  Figures:

* commits/s for ``MemoryStore`` and ``SQLiteStore`` (one run);
* the ratio of ``SQLiteStore`` to a raw ``sqlite3`` loop that writes the very
  same rows (head, changed parts, event) with the same statements the store
  used to run (``BEGIN IMMEDIATE``, the row read, the compare-and-set
  ``UPDATE``, the part upserts, the last event sequence read, the event
  insert, ``COMMIT``) and the same durability settings (WAL,
  ``synchronous=FULL``, ``foreign_keys=ON``) in this process: the physical
  floor.  Raw and store rounds are interleaved and the median ratio
  reported, since the disk is shared and noisy (target >= 0.8x);
* (issue 21) the single-run commit against the raw commit and a bare
  writer-thread round trip, composed: the raw loop's commit written in the
  store's writer thread, one round trip a commit, interleaved with the
  store's rounds (target <= 1.3x); and, for reference, against the raw
  loop's figure and a round trip doing nothing's, measured apart and summed;
* 100 runs committing concurrently (group commit) against the single-run rate
  (target >= 4x): each round measures one run alone, then the 100 runs, on
  one fresh store, and the median of the rounds' ratios is reported;
* the cost of commit 5 000 of one run against commit 10 (target <= 1.5x): a
  run grown to 4 999 commits commits on (commits 5 000, 5 001, ...)
  alternately with fresh runs grown to 9 commits committing their 10th and
  11th, and the median latencies are compared;
* this disk's own figures, the ones issue 4 quotes for its machine (about
  2,400-2,900 single-row commits/s with WAL and ``synchronous=FULL``, about
  21,000 rows/s when 50 rows share a commit): both ratio targets weigh a
  store's fixed cost per commit (the hand-off to the writer thread, the
  encoding) against the disk's commit time, so they depend on how fast the
  disk syncs, and the figures say how this disk compares;
* ``PostgresStore`` (single run and 100 runs) when ``TRIO_BACKPLANE_PG_DSN``
  is set and ``trio_backplane.store.PostgresStore`` is importable.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio

from trio_backplane.kernel import (
    Command,
    FrozenList,
    RunEvent,
    RunRecord,
    encode_event,
    freeze,
)
from trio_backplane.kernel import transition as _transition
from trio_backplane.store import MemoryStore, SQLiteStore
from trio_backplane.store._diff import NOTHING, diff
from trio_backplane.store._layout import dumps, head_text
from trio_backplane.store._sql._sqlite import _SCHEMA

QUICK = "--quick" in sys.argv
Commit = tuple[RunRecord, RunRecord, list[RunEvent]]


def fresh(run_id: str) -> RunRecord:
    return RunRecord.new(run_id, work=1_000_000, context={"conversation": {"messages": []}})


def step(record: RunRecord, n: int) -> tuple[RunRecord, list[RunEvent]]:
    """Commit ``n`` of the workload from ``record``."""
    if record.state == "queued":
        return _transition(record, Command("admit", 0.0, {"state": "running"}))
    if record.active_provider is None:
        return _transition(record, Command("provider_started", float(n)))
    # One message appended to the transcript (the record's growing field):
    # a store writes the new message alone.
    message = freeze({"role": "assistant", "content": f"reply {n}: " + "lorem ipsum " * 8})
    return _transition(
        record,
        Command(
            "provider_completed",
            float(n),
            {"result": {"text": f"reply {n}"}, "messages": FrozenList((message,))},
        ),
    )


def chain(record: RunRecord, count: int) -> tuple[RunRecord, list[Commit]]:
    """The next ``count`` commits of the workload from ``record``, precomputed."""
    commits: list[Commit] = []
    for n in range(count):
        new, events = step(record, record.revision + n)
        commits.append((record, new, events))
        record = new
    return record, commits


async def commit(store: Any, old: RunRecord, new: RunRecord, events: list[RunEvent]) -> None:
    await store.commit(
        old.run_id,
        incarnation=old.incarnation,
        expected_revision=old.revision,
        record=new,
        events=events,
    )


async def drive(store: Any, commits: list[Commit]) -> float:
    """Commit the precomputed ``commits`` one after the other; commits/s."""
    start = time.perf_counter()
    for old, new, events in commits:
        await commit(store, old, new, events)
    return len(commits) / (time.perf_counter() - start)


# -- raw sqlite3 loop -------------------------------------------------------------


def raw_rows(record: RunRecord, count: int) -> tuple[RunRecord, list[tuple[Any, ...]]]:
    """The exact statements' parameters a store writes for ``count`` commits."""
    entry = diff(NOTHING, record)[0]
    record, commits = chain(record, count)
    plan = []
    for old, new, events in commits:
        entry, upserts, _deletes = diff(entry, new)
        head = head_text(new)
        encoded = [encode_event(e) for e in events]
        plan.append((old, new, head, upserts, encoded))
    return record, plan


def open_raw(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    for statement in _SCHEMA:
        conn.execute(statement)
    return conn


def raw_create(conn: sqlite3.Connection, record: RunRecord) -> None:
    head = head_text(record)
    conn.execute(
        "INSERT INTO runs VALUES (?, ?, ?, ?, ?)",
        (record.run_id, record.incarnation, record.revision, record.state, head),
    )


def raw_params(
    item: tuple[Any, ...], last: int
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """One commit of a ``raw_rows`` plan as the parameters of its statements,
    its events numbered after ``last``: the compare-and-set ``UPDATE``'s
    (new identity, state and head; run id, old incarnation and revision),
    the changed parts' and the events' rows."""
    old, new, head, upserts, events = item
    run_id = new.run_id
    update = (new.incarnation, new.revision, new.state, head, run_id, old.incarnation, old.revision)
    parts = [(run_id, *row) for row in upserts]
    rows = [
        (run_id, last + i, e["type"], e["occurred_at"], dumps(e["payload"]))
        for i, e in enumerate(events, start=1)
    ]
    return update, parts, rows


def raw_commit(conn: sqlite3.Connection, item: tuple[Any, ...], last: int) -> int:
    """One commit of a ``raw_rows`` plan (:func:`raw_params`): the rows a
    store must write in one durable transaction, and nothing else.  The
    last event sequence afterwards."""
    update, parts, rows = raw_params(item, last)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "UPDATE runs SET incarnation = ?, revision = ?, state = ?, head = ?"
        " WHERE run_id = ? AND incarnation = ? AND revision = ?",
        update,
    )
    conn.executemany(
        "INSERT INTO run_parts VALUES (?, ?, ?, ?) ON CONFLICT (run_id, part, key)"
        " DO UPDATE SET value = excluded.value",
        parts,
    )
    conn.executemany("INSERT INTO run_events VALUES (?, ?, ?, ?, ?)", rows)
    conn.execute("COMMIT")
    return last + len(rows)


def last_sequence(conn: sqlite3.Connection, run_id: str) -> int:
    query = "SELECT COALESCE(MAX(sequence), 0) FROM run_events WHERE run_id = ?"
    return int(conn.execute(query, (run_id,)).fetchone()[0])


def raw_loop(conn: sqlite3.Connection, plan: list[Any]) -> float:
    """commits/s of the plain loop writing ``plan``, one ``raw_commit``
    after the other in one thread."""
    last = last_sequence(conn, plan[0][1].run_id)
    start = time.perf_counter()
    for item in plan:
        last = raw_commit(conn, item, last)
    return len(plan) / (time.perf_counter() - start)


async def handed(
    store: Any, commit_one: Callable[[Any, int], int], plan: list[Any], last: int
) -> tuple[float, int]:
    """µs a commit of ``plan`` written raw (``commit_one(item, last)``, no
    store code) in ``store``'s writer thread, one round trip a commit on the
    path a commit batch takes, awaited on Trio before the next: the raw
    commit and the bare round trip composed, as a store's commit composes
    them.  Between commits the writer thread sleeps, and a database round
    trip after a sleep is slower than one in a hot loop (on this machine a
    PostgresStore batch driven from a plain thread took 411-487 us back to
    back, 569 us after a 100 us sleep and 662 us after a 300 us one), which
    the raw loop's figure plus the bare round trip's does not show.  Also
    the last event sequence afterwards."""
    workers = store._workers
    sequence = [last]

    def write(item: Any, driver: Any) -> None:
        sequence[0] = commit_one(item, sequence[0])

    start = time.perf_counter()
    for item in plan:
        await round_trip(workers, partial(write, item))
    return (time.perf_counter() - start) / len(plan) * 1e6, sequence[0]


async def round_trip(workers: Any, fn: Callable[[Any], None]) -> None:
    """``fn(driver)`` in the writer thread on the path a commit batch takes
    (the worker's queue in, the wake-up out; a connection slot first when
    the store has slots)."""
    if workers.limiter is None:
        await workers.run(fn, withdrawable=False, wake=True, writer=True)
    else:
        async with workers.limiter:
            await workers.run(fn, withdrawable=False, wake=True, slot_held=True, writer=True)


def disk_floor(path: Path, count: int = 2000, rows: int = 50) -> tuple[float, float]:
    """This disk's durable commit speed as issue 4 quotes it: (single-row
    commits/s, rows/s with ``rows`` rows a commit), WAL, ``synchronous=FULL``;
    the median of three rounds each."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT)")
        value = "x" * 100
        single, grouped = [], []
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(count):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO t (v) VALUES (?)", (value,))
                conn.execute("COMMIT")
            single.append(count / (time.perf_counter() - start))
            start = time.perf_counter()
            for _ in range(count // rows):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT INTO t (v) VALUES (?)", [(value,)] * rows)
                conn.execute("COMMIT")
            grouped.append(count // rows * rows / (time.perf_counter() - start))
        return statistics.median(single), statistics.median(grouped)
    finally:
        conn.close()


# -- sections ---------------------------------------------------------------------


async def single_run(root: Path) -> float:
    rounds, per_round = (5, 100) if QUICK else (7, 300)
    memory = MemoryStore()
    record = fresh("m")
    await memory.create(record)
    _, commits = chain(record, per_round * rounds)
    memory_rate = await drive(memory, commits)
    print(f"MemoryStore      single run: {memory_rate:10.0f} commits/s")

    conn = open_raw(root / "raw.db")
    raw_record = fresh("raw")
    raw_create(conn, raw_record)
    through = open_raw(root / "handed.db")
    handed_record = fresh("raw")
    raw_create(through, handed_record)
    last = last_sequence(through, handed_record.run_id)
    async with SQLiteStore(root / "single.db") as store:
        record = fresh("s")
        await store.create(record)
        store_rates, raw_rates, ratios, handed_us, composed = [], [], [], [], []
        for _ in range(rounds):
            raw_record, plan = raw_rows(raw_record, per_round)
            handed_record, handed_plan = raw_rows(handed_record, per_round)
            record, commits = chain(record, per_round)
            raw_rate = await trio.to_thread.run_sync(raw_loop, conn, plan)
            us, last = await handed(store, partial(raw_commit, through), handed_plan, last)
            rate = await drive(store, commits)
            raw_rates.append(raw_rate)
            handed_us.append(us)
            store_rates.append(rate)
            ratios.append(rate / raw_rate)
            composed.append(1e6 / rate / us)
        hand_off = await hand_off_floor(store)
    conn.close()
    through.close()
    store_rate = statistics.median(store_rates)
    raw_rate = statistics.median(raw_rates)
    print(f"raw sqlite3 loop single run: {raw_rate:10.0f} commits/s")
    print(f"SQLiteStore      single run: {store_rate:10.0f} commits/s")
    print(
        f"  ratio SQLiteStore / raw loop: median {statistics.median(ratios):.2f}x "
        f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)}; target >= 0.8x)"
    )
    single_ratios(
        "SQLiteStore",
        store_rate=store_rate,
        raw_rate=raw_rate,
        hand_off=hand_off,
        handed_us=handed_us,
        composed=composed,
    )
    print(
        f"  the store's cost a commit above the raw loop: {1e6 / store_rate - 1e6 / raw_rate:.0f}us"
        " (hand-off, encoding, decision: CPU time, not disk time)"
    )
    return store_rate


def single_ratios(
    label: str,
    *,
    store_rate: float,
    raw_rate: float,
    hand_off: float,
    handed_us: list[float],
    composed: list[float],
) -> None:
    """The single-run commit against (raw commit + bare round trip): composed
    (the raw commit made through the writer, each round's ratio) and summed
    (the raw loop's and the bare round trip's figures added)."""
    store_us, raw_us = 1e6 / store_rate, 1e6 / raw_rate
    print(
        f"  {label} commit {store_us:.0f}us against the raw commit made through the writer"
        f" thread, one round trip a commit ({statistics.median(handed_us):.0f}us): median"
        f" {statistics.median(composed):.2f}x (rounds: {', '.join(f'{r:.2f}' for r in composed)};"
        " target <= 1.3x)"
    )
    print(
        f"  against the raw loop ({raw_us:.0f}us) + one round trip doing nothing"
        f" ({hand_off:.0f}us), summed: {store_us / (raw_us + hand_off):.2f}x"
    )


async def hand_off_floor(store: Any, count: int = 2000) -> float:
    """µs of one round trip through the store's worker with no work, on the
    path a commit batch takes (the worker's queue in, the wake-up out): the
    hand-off every commit pays for keeping blocking calls off the Trio thread."""
    workers = store._workers

    def nothing(driver: Any) -> None:
        return None

    times = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(count):
            await round_trip(workers, nothing)
        times.append((time.perf_counter() - start) / count * 1e6)
    return statistics.median(times)


async def concurrent(make: Callable[[], Awaitable[Any]], single_rate: float, label: str) -> None:
    """100 runs committing at once (group commit) against one run committing
    alone.  The machine's speed drifts within minutes, so each round measures
    both on one fresh store back to back (a single run's commits first, then
    the 100 runs), and the median of the rounds' ratios is the figure; the
    ratio to the earlier single-run section is printed beside it."""
    rounds = 3 if QUICK else 5
    runs, count = (100, 10) if QUICK else (100, 30)
    rates: list[float] = []
    ratios: list[float] = []
    per_transaction: list[float] = []
    trio_cpu: list[float] = []
    writer_cpu: list[float] = []
    for n in range(rounds):
        store = await make()
        writer = _WriterClock(store)
        try:
            alone = fresh(f"alone-{n}")
            await store.create(alone)
            _, commits = chain(alone, 100 if QUICK else 300)
            alone_rate = await drive(store, commits)
            records = [fresh(f"c{n}-{i:03d}") for i in range(runs)]
            chains = [chain(record, count)[1] for record in records]
            for record in records:
                await store.create(record)
            batches_before = getattr(store, "stats", {}).get("batches", 0)

            writer.seconds = 0.0
            start, cpu = time.perf_counter(), time.thread_time()
            async with trio.open_nursery() as nursery:
                for chained in chains:
                    nursery.start_soon(drive, store, chained)
            rate = runs * count / (time.perf_counter() - start)
            trio_cpu.append((time.thread_time() - cpu) / (runs * count) * 1e6)
            writer_cpu.append(writer.seconds / (runs * count) * 1e6)
            batches = getattr(store, "stats", {}).get("batches", 0) - batches_before
            if batches:
                per_transaction.append(runs * count / batches)
        finally:
            await store.aclose()
        rates.append(rate)
        ratios.append(rate / alone_rate)
    rate = statistics.median(rates)
    extra = (
        f", {statistics.median(per_transaction):.1f} commits per transaction"
        if per_transaction
        else ""
    )
    print(
        f"{label} 100 concurrent runs: {rate:10.0f} commits/s = median "
        f"{statistics.median(ratios):.1f}x the single-run rate of the same round "
        f"(rounds: {', '.join(f'{r:.1f}' for r in ratios)}; target >= 4x){extra}"
    )
    print(f"  against the single-run section above: {rate / single_rate:.1f}x")
    if writer.hooked:
        print(
            f"  CPU per commit (medians): Trio thread {statistics.median(trio_cpu):.1f} us, "
            f"writer thread {statistics.median(writer_cpu):.1f} us; the two share "
            "Python's lock, so their sum bounds the rate"
        )


class _WriterClock:
    """CPU seconds a SQL store's workers spend writing batches
    (``time.thread_time`` inside the engine's ``_batch``)."""

    def __init__(self, store: Any) -> None:
        self.seconds = 0.0
        inner = getattr(store, "_store", store)
        batch = getattr(inner, "_batch", None)
        self.hooked = batch is not None
        if batch is None:
            return

        def timed(*args: Any) -> None:
            cpu = time.thread_time()
            try:
                batch(*args)
            finally:
                self.seconds += time.thread_time() - cpu

        inner._batch = timed


async def late_vs_early(root: Path) -> None:
    grow, window = (1000, 60) if QUICK else (5000, 200)
    async with SQLiteStore(root / "growth.db") as store:
        long_run = fresh("long")
        await store.create(long_run)
        start = time.perf_counter()
        for _ in range(grow - 1):  # not precomputed: 5 000 records held would load the GC
            long_run, commits = chain(long_run, 1)
            await drive(store, commits)
        print(f"  (grew one run to {grow - 1} commits in {time.perf_counter() - start:.1f}s)")
        # fresh runs at revision 9: each commits its 10th and 11th commit below
        short_runs = []
        for i in range(window // 2):
            short_run = fresh(f"short-{i:03d}")
            await store.create(short_run)
            short_run, commits = chain(short_run, 9)
            await drive(store, commits)
            short_runs.append(short_run)
        assert long_run.revision == grow - 1
        assert all(run.revision == 9 for run in short_runs)
        early: list[float] = []
        late: list[float] = []
        early_store: list[float] = []
        late_store: list[float] = []
        for i in range(window):
            for early_side in (True, False):
                run = short_runs[i // 2] if early_side else long_run
                t0 = time.perf_counter()
                new, events = step(run, run.revision)
                t1 = time.perf_counter()
                await commit(store, run, new, events)
                t2 = time.perf_counter()
                (early if early_side else late).append(t2 - t0)
                (early_store if early_side else late_store).append(t2 - t1)
                if early_side:
                    short_runs[i // 2] = new
                else:
                    long_run = new
        rows = store.stats["last_part_rows"]
    assert all(run.revision == 11 for run in short_runs)
    assert long_run.revision == grow - 1 + window
    e, lt = statistics.median(early_store), statistics.median(late_store)
    print(
        f"commit {grow} vs commit 10 of one run (store.commit): {lt * 1e6:.0f}us vs "
        f"{e * 1e6:.0f}us = {lt / e:.2f}x (target <= 1.1x; {rows} part rows per commit; "
        f"transcript {len(long_run.transcript)}"
        f" messages; commits {grow}..{grow + window - 1} vs commits 10 and 11 of"
        f" {len(short_runs)} runs)"
    )
    e, lt = statistics.median(early), statistics.median(late)
    print(
        f"  with the kernel transition building it: {lt * 1e6:.0f}us vs {e * 1e6:.0f}us"
        f" = {lt / e:.2f}x"
    )


def pg_commit(conn: Any, item: tuple[Any, ...], last: int) -> int:
    """One commit of a ``raw_rows`` plan with psycopg (:func:`raw_params`):
    the statements in one pipeline, then ``COMMIT``, as a store's fast path
    sends them.  The last event sequence afterwards."""
    update, parts, rows = raw_params(item, last)
    with conn.pipeline(), conn.cursor() as cur:
        cur.execute(
            "UPDATE runs SET incarnation = %s, revision = %s, state = %s, head = %s"
            " WHERE run_id = %s AND incarnation = %s AND revision = %s",
            update,
        )
        cur.executemany(
            "INSERT INTO run_parts VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (run_id, part, key) DO UPDATE SET value = EXCLUDED.value",
            parts,
        )
        cur.executemany("INSERT INTO run_events VALUES (%s, %s, %s, %s, %s)", rows)
    conn.commit()
    return last + len(rows)


def pg_connect(dsn: str, schema: str) -> Any:
    """A psycopg connection to ``schema``'s tables."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=False)
    conn.execute(f'SET search_path TO "{schema}"')
    conn.commit()
    return conn


def pg_last(conn: Any, run_id: str) -> int:
    query = "SELECT coalesce(max(sequence), 0) FROM run_events WHERE run_id = %s"
    last = int(conn.execute(query, (run_id,)).fetchone()[0])
    conn.commit()
    return last


def pg_raw_loop(dsn: str, schema: str, plan: list[Any]) -> float:
    """commits/s of a plain psycopg loop writing ``plan`` into ``schema``'s
    tables, one ``pg_commit`` after the other in one thread."""
    with pg_connect(dsn, schema) as conn:
        last = pg_last(conn, plan[0][1].run_id)
        start = time.perf_counter()
        for item in plan:
            last = pg_commit(conn, item, last)
        return len(plan) / (time.perf_counter() - start)


def drop_schemas(dsn: str, schemas: list[str]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def postgres() -> float | None:
    dsn = os.environ.get("TRIO_BACKPLANE_PG_DSN")
    if not dsn:
        print("PostgresStore: skipped (TRIO_BACKPLANE_PG_DSN not set)")
        return None
    from trio_backplane.store import PostgresStore

    tag = f"{os.getpid()}_{time.time_ns()}"
    raw_schema, handed_schema = f"bench_raw_{tag}", f"bench_handed_{tag}"
    store_schema = f"bench_store_{tag}"
    rounds, per_round = (3, 100) if QUICK else (7, 200)
    through: Any = None
    try:
        for schema in (raw_schema, handed_schema):
            async with PostgresStore(dsn, schema=schema) as raw_tables:
                await raw_tables.create(fresh("raw"))
        raw_record = handed_record = fresh("raw")
        through = await trio.to_thread.run_sync(pg_connect, dsn, handed_schema)
        last = await trio.to_thread.run_sync(pg_last, through, handed_record.run_id)
        async with PostgresStore(dsn, schema=store_schema) as store:
            record = fresh("s")
            await store.create(record)
            store_rates, raw_rates, handed_us, composed = [], [], [], []
            for _ in range(rounds):
                raw_record, plan = raw_rows(raw_record, per_round)
                handed_record, handed_plan = raw_rows(handed_record, per_round)
                record, commits = chain(record, per_round)
                raw_rates.append(await trio.to_thread.run_sync(pg_raw_loop, dsn, raw_schema, plan))
                us, last = await handed(store, partial(pg_commit, through), handed_plan, last)
                rate = await drive(store, commits)
                handed_us.append(us)
                store_rates.append(rate)
                composed.append(1e6 / rate / us)
            hand_off = await hand_off_floor(store)
    finally:
        if through is not None:
            through.close()
        await trio.to_thread.run_sync(drop_schemas, dsn, [raw_schema, handed_schema, store_schema])
    rate, raw_rate = statistics.median(store_rates), statistics.median(raw_rates)
    print(f"raw psycopg loop single run: {raw_rate:10.0f} commits/s")
    print(f"PostgresStore    single run: {rate:10.0f} commits/s")
    single_ratios(
        "PostgresStore",
        store_rate=rate,
        raw_rate=raw_rate,
        hand_off=hand_off,
        handed_us=handed_us,
        composed=composed,
    )
    suffix = tag

    async def make_unique() -> Any:
        return _Renamed(PostgresStore(dsn), suffix)

    await concurrent(make_unique, rate, "PostgresStore   ")
    return rate


async def conversations(make: Callable[[], Awaitable[Any]], label: str) -> None:
    """Steps a second of N conversations at once on one store, 10 tool steps
    each (``bench_engine``'s step), for N = 100 and 1,000, in interleaved
    rounds (a fresh store each) after a warm-up round: the rate must hold
    as N grows (target: 1,000 at least as fast as 100; the median of the
    rounds' ratios)."""
    from bench_engine import one_run

    rates: dict[int, list[float]] = {100: [], 1000: []}
    collecting: dict[int, list[float]] = {100: [], 1000: []}
    # The earlier sections' objects (thousands of precomputed records) would
    # be traversed by every full collection: set them aside, as a host that
    # loaded its code and data before serving would (``gc.freeze``).
    gc.collect()
    gc.freeze()
    try:
        await _conversation_rounds(make, one_run, rates, collecting)
    finally:
        gc.unfreeze()
    ratios = [big / small for small, big in zip(rates[100], rates[1000], strict=True)]
    print(
        f"{label} conversations of 10 steps at once: 100 -> {statistics.median(rates[100]):.0f}"
        f" steps/s, 1,000 -> {statistics.median(rates[1000]):.0f} steps/s (median ratio"
        f" {statistics.median(ratios):.2f}x, rounds: {', '.join(f'{r:.2f}' for r in ratios)};"
        " target >= 1x)"
    )
    print(
        f"  time in CPython's cycle collector: {statistics.median(collecting[100]):.0%} of the"
        f" 100 conversations' runs, {statistics.median(collecting[1000]):.0%} of the 1,000's"
    )


async def _conversation_rounds(
    make: Callable[[], Awaitable[Any]],
    one_run: Callable[..., Awaitable[Any]],
    rates: dict[int, list[float]],
    collecting: dict[int, list[float]],
) -> None:
    """Interleaved rounds of 100 and 1,000 conversations, a fresh store
    each, after one round not counted: the process's first 1,000
    conversations also grow its heap and fill the caches (that round's
    ratio read 0.70-0.90x in six runs, the later rounds' 0.84-1.20x)."""
    for measured in (False, *[True] * (2 if QUICK else 3)):
        for n in (100, 1000):
            store = await make()
            clock = _CollectorClock()
            try:
                start = time.perf_counter()
                with clock:
                    async with trio.open_nursery() as nursery:
                        for i in range(n):
                            run_id = f"conv-{n}-{i}-{time.time_ns()}"
                            nursery.start_soon(one_run, store, run_id, 10)
                elapsed = time.perf_counter() - start
                if measured:
                    rates[n].append(n * 10 / elapsed)
                    collecting[n].append(clock.seconds / elapsed)
            finally:
                await store.aclose()


class _CollectorClock:
    """Seconds the cycle collector runs while in the ``with`` block."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> None:
        gc.callbacks.append(self._callback)

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)


class _Renamed:
    """A store wrapper giving every run a unique id (a shared database)."""

    def __init__(self, store: Any, suffix: str) -> None:
        self._store, self._suffix = store, suffix

    def _id(self, run_id: str) -> str:
        return f"{run_id}-{self._suffix}"

    async def create(self, record: RunRecord) -> Any:
        return await self._store.create(attrs.evolve(record, run_id=self._id(record.run_id)))

    async def commit(self, run_id: str, *, record: RunRecord, **kwargs: Any) -> Any:
        return await self._store.commit(
            self._id(run_id), record=attrs.evolve(record, run_id=self._id(run_id)), **kwargs
        )

    async def aclose(self) -> None:
        await self._store.aclose()


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench_store-") as tmp:
        root = Path(tmp)
        print(f"sqlite {sqlite3.sqlite_version}, trio {trio.__version__}, files in {root}")
        one, fifty = await trio.to_thread.run_sync(disk_floor, root / "disk.db")
        print(
            f"this disk: {one:.0f} single-row commits/s, {fifty:.0f} rows/s at 50 rows a commit"
            " (issue 4's machine: about 2,400-2,900 and 21,000)"
        )
        single = await single_run(root)

        async def make() -> SQLiteStore:
            return SQLiteStore(root / f"concurrent-{time.time_ns()}.db")

        await concurrent(make, single, "SQLiteStore     ")
        await late_vs_early(root)
        await conversations(make, "SQLiteStore     ")
    await postgres()
    dsn = os.environ.get("TRIO_BACKPLANE_PG_DSN")
    if dsn:
        from trio_backplane.store import PostgresStore

        schemas: list[str] = []

        async def make_pg() -> Any:
            schemas.append(f"bench_conv_{os.getpid()}_{time.time_ns()}")
            return PostgresStore(dsn, schema=schemas[-1], max_connections=4)

        try:
            await conversations(make_pg, "PostgresStore   ")
        finally:
            await trio.to_thread.run_sync(drop_schemas, dsn, schemas)


if __name__ == "__main__":
    trio.run(main)
