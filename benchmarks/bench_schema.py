"""How much does the schema boundary cost on the hot path?

    python benchmarks/bench_schema.py [--quick]

Workloads: ``benchmarks/workloads/schemas.json`` beside this script (``tool``
and ``big_defs``, one valid and one invalid instance each; see the README
there).  Contenders, all in this process:

* ``raw is_valid``: a compiled ``jsonschema_rs`` validator's ``is_valid``
  (offline), the baseline every ratio divides by;
* ``ours compiled``: ``CompiledSchema.validate`` (input checks + engine; on an
  invalid instance it also collects the error entries);
* ``ours validate()``: ``validate(schema, args)``, which fingerprints the
  schema on every call to find the cached compiled validator;
* ``python jsonschema``: ``Draft202012Validator.is_valid`` (jsonschema 4.26);
* ``fastjsonschema``: a draft-07 rewrite (it cannot express 2020-12).

Each figure is the median of 7 interleaved repeats, in microseconds per call;
the ratio divides by ``raw is_valid`` on the same workload and instance.

Then the cost of compiling each workload's schema, in microseconds per
compile: ``raw validator_for`` (``jsonschema_rs.validator_for(schema,
offline=True)``, the baseline) and ``ours compile()`` with the compiled-schema
cache emptied before every call (``schema.cache_clear()``), so each call pays
the fingerprint, the preflight and the engine's build.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import jsonschema_rs

from trio_backplane import Error, schema
from trio_backplane.schema._instance import fast_check

WORKLOADS = Path(__file__).resolve().parent / "workloads"


def calibrate(fn: Callable[[], Any], seconds: float) -> int:
    """How many calls of ``fn`` take about ``seconds``."""
    fn()
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed > seconds / 5:
            return max(1, int(number * seconds / elapsed))
        number *= 2


def measure(calls: dict[str, Callable[[], Any]], budget: float) -> dict[str, float]:
    """Median microseconds per call of each contender over 7 interleaved
    repeats (contenders alternate, so a noisy neighbour hits all alike)."""
    numbers = {label: calibrate(fn, budget / 7) for label, fn in calls.items()}
    samples: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(7):
        for label, fn in calls.items():
            number = numbers[label]
            start = time.perf_counter()
            for _ in range(number):
                fn()
            samples[label].append((time.perf_counter() - start) / number * 1e6)
    return {label: statistics.median(values) for label, values in samples.items()}


def swallow(fn: Callable[[Any], Any], value: Any) -> Callable[[], Any]:
    def call() -> Any:
        try:
            return fn(value)
        except Error:
            return None

    return call


def to_draft07(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$schema":
                out[key] = "http://json-schema.org/draft-07/schema#"
            elif key == "$defs":
                out["definitions"] = to_draft07(value)
            elif key == "$ref" and isinstance(value, str):
                out[key] = value.replace("#/$defs/", "#/definitions/")
            else:
                out[key] = to_draft07(value)
        return out
    if isinstance(node, list):
        return [to_draft07(v) for v in node]
    return node


def main(argv: list[str]) -> int:
    budget = 0.25 if "--quick" in argv else 1.0
    workloads = json.loads((WORKLOADS / "schemas.json").read_text())
    contenders: dict[str, Callable[[dict[str, Any]], Callable[[Any], Any]]] = {}
    contenders["raw is_valid"] = lambda s: jsonschema_rs.validator_for(s, offline=True).is_valid
    contenders["ours compiled"] = lambda s: schema.compile(s).validate
    contenders["ours validate()"] = lambda s: lambda args: schema.validate(s, args)
    try:
        import jsonschema

        contenders["python jsonschema"] = lambda s: jsonschema.Draft202012Validator(s).is_valid
    except ImportError:  # pragma: no cover
        print("python jsonschema not installed: skipped")
    try:
        import fastjsonschema

        contenders["fastjsonschema (07)"] = lambda s: fastjsonschema.compile(to_draft07(s))
    except ImportError:  # pragma: no cover
        print("fastjsonschema not installed: skipped")

    print(
        f"python {sys.version.split()[0]}, jsonschema_rs {version('jsonschema_rs')}, "
        f"C input check: {'yes' if fast_check is not None else 'no (pure Python)'}"
    )
    print(f"{'workload':<18}{'contender':<22}{'us/call':>10}{'x raw':>9}")
    for name, work in workloads.items():
        for kind in ("valid", "invalid"):
            instance = work[kind]
            calls = {}
            for label, make in contenders.items():
                fn = make(work["schema"])
                guard = swallow_any if label.startswith("fastjsonschema") else swallow
                calls[label] = guard(fn, instance)
            figures = measure(calls, budget)
            base = figures["raw is_valid"]
            for label, us in figures.items():
                print(f"{name + '/' + kind:<18}{label:<22}{us:>10.2f}{us / base:>9.2f}")
    print(f"{'workload':<18}{'contender':<22}{'us/compile':>10}{'x raw':>9}")
    for name, work in workloads.items():
        figures = measure(compiles(work["schema"]), budget)
        base = figures["raw validator_for"]
        for label, us in figures.items():
            print(f"{name + '/compile':<18}{label:<22}{us:>10.2f}{us / base:>9.2f}")
    return 0


def compiles(document: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """Building a validator for ``document``: the engine alone, and ours
    uncached (the cache emptied first, so preflight and build run each time)."""

    def ours() -> Any:
        schema.cache_clear()
        return schema.compile(document)

    return {
        "raw validator_for": lambda: jsonschema_rs.validator_for(document, offline=True),
        "ours compile()": ours,
    }


def swallow_any(fn: Callable[[Any], Any], value: Any) -> Callable[[], Any]:
    def call() -> Any:
        try:
            return fn(value)
        except Exception:
            return None

    return call


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
