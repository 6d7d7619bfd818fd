"""Run the official JSON-Schema-Test-Suite Draft 2020-12 through ``validate_output``.

    python conformance/run.py [--all]

Fetches the suite (``fetch.py``), runs the required cases (SCH-42), the
``optional/format`` cases with ``format_assertion=True`` (SCH-13) and the other
optional cases (informational), prints the failing cases (at most 50, or all
with ``--all``) and then one summary line per group::

    required: N passed, N failed
    format: N passed, N failed
    optional: N passed, N failed
    other-dialect (unsupported_capability): N

Exit status: 0 if required and format have no failure, 1 otherwise, 2 if the
suite cannot be fetched.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fetch
import suite

MAX_LISTED = 50


def main(argv: list[str]) -> int:
    show_all = "--all" in argv
    try:
        root = fetch.suite_dir()
    except fetch.FetchError as exc:
        print(f"error: cannot obtain JSON-Schema-Test-Suite: {exc}", file=sys.stderr)
        return 2
    registry = suite.remotes(root)
    groups = {
        "required": suite.required_cases(root),
        "format": suite.format_cases(root),
        "optional": suite.optional_cases(root),
    }
    summary: list[str] = []
    failures: list[str] = []
    counts: dict[str, int] = {}
    started = time.perf_counter()
    for name, cases in groups.items():
        passed = failed = 0
        for case in cases:
            ok, outcome = suite.judge(case, registry)
            if ok:
                passed += 1
                continue
            failed += 1
            line = f"FAIL {name}: {case.id}: expected {case.expected}, got {outcome.verdict}"
            if outcome.detail:
                line += f": {outcome.detail}"
            failures.append(line)
        counts[name] = failed
        summary.append(f"{name}: {passed} passed, {failed} failed")
    elapsed = time.perf_counter() - started

    limit = len(failures) if show_all else MAX_LISTED
    for line in failures[:limit]:
        print(line if len(line) <= 400 or show_all else line[:397] + "...")
    if len(failures) > limit:
        print(f"... and {len(failures) - limit} more failures (--all lists them)")
    print(f"other-dialect (unsupported_capability): {len(suite.OTHER_DIALECT)}")
    for stem, description in sorted(suite.OTHER_DIALECT):
        print(f"  {stem}::{description}")
    print(f"suite: {root} (commit {fetch.COMMIT}), {elapsed:.1f}s", file=sys.stderr)
    for line in summary:
        print(line)
    return 1 if counts["required"] or counts["format"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
