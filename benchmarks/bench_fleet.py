"""What the fleet sustains: runs per second through 1, 2 and 4 worker
processes on one PostgreSQL, and how soon a SIGKILLed worker's run is
taken over against the lease length.

    TRIO_BACKPLANE_PG_DSN=postgresql://... python benchmarks/bench_fleet.py [--runs N]

Workload: runs of one agent (a provider turn asking for a tool that sleeps
1 s, then a final answer): I/O-bound, so more workers should mean more
runs per second even on 2 cores, until the CPU the runs do cost (their
commits, the engine, PostgreSQL itself) fills the cores.  Each figure submits ``--runs`` runs to a
fresh schema, starts the workers (``--concurrency 8`` each) and times from
the first worker's start until every run is finished.

Takeover: one worker holds a run whose provider never answers; it is
SIGKILLed; a second worker (already polling) takes the run over once the
lease lapses.  Reported: seconds from the kill to the run finished, in
lease lengths (target: within 2).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from trio_backplane.fleet import submit, wait

ROOT = Path(__file__).resolve().parent


def _worker(dsn: str, schema: str, name: str, lease: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'workloads'}:{ROOT.parent}"}
    return subprocess.Popen(
        [sys.executable, "-m", "trio_backplane.cli", "worker", "--db", dsn, "--app",
         "fleet_app", "--schema", schema, "--concurrency", "8", "--lease", str(lease),
         "--worker-id", name, "--drain-timeout", "5"],
        env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip


def _drop(dsn: str, schema: str) -> None:
    psycopg: Any = importlib.import_module("psycopg")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.wait(timeout=60)


def throughput(dsn: str, processes: int, runs: int) -> float:
    schema = f"bench_{uuid.uuid4().hex[:12]}"

    async def submit_all() -> list[str]:
        return [await submit(dsn, agent="io", prompt="go", schema=schema) for _ in range(runs)]

    async def wait_all(ids: list[str]) -> None:
        for run_id in ids:
            status = await wait(dsn, run_id, schema=schema, timeout=600)
            assert status["outcome"] == "completed", status

    ids = trio.run(submit_all)
    start = time.perf_counter()
    workers = [_worker(dsn, schema, f"w{n}", 10.0) for n in range(processes)]
    try:
        trio.run(wait_all, ids)
        elapsed = time.perf_counter() - start
    finally:
        _stop(workers)
        _drop(dsn, schema)
    return runs / elapsed


def takeover(dsn: str, lease: float) -> float:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    first = _worker(dsn, schema, "doomed", lease)
    try:
        run_id = trio.run(lambda: submit(dsn, agent="hang", prompt="go", schema=schema))
        time.sleep(2.0)  # claimed, and waiting in its provider
        second = _worker(dsn, schema, "taker", lease)
        time.sleep(1.0)
        killed = time.perf_counter()
        first.send_signal(signal.SIGKILL)
        status = trio.run(lambda: wait(dsn, run_id, schema=schema, timeout=120, poll_interval=0.02))
        latency = time.perf_counter() - killed
        assert status["claims"] == 2, status
        _stop([second])
    finally:
        first.kill()
        _drop(dsn, schema)
    return latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--lease", type=float, default=2.0)
    args = parser.parse_args()
    dsn = os.environ.get("TRIO_BACKPLANE_PG_DSN")
    if not dsn:
        sys.exit("set TRIO_BACKPLANE_PG_DSN")
    rates = {n: throughput(dsn, n, args.runs) for n in (1, 2, 4)}
    for n, rate in rates.items():
        print(f"{n} worker(s): {rate:7.1f} runs/s   {rate / rates[1]:5.2f}x one worker")
    latency = takeover(dsn, args.lease)
    print(
        f"takeover after SIGKILL: {latency:5.2f} s with a {args.lease} s lease "
        f"= {latency / args.lease:4.2f} lease lengths"
    )


if __name__ == "__main__":
    main()
