"""How many instructions does the engine's tool-call step take?

    python benchmarks/instructions.py [--steps N] [--at REV] [--pure-python] [--workload W]
    python3 -m nox -s instructions -- [--steps N] [--at REV] [--pure-python]

The wall-clock figures of ``bench_engine.py`` move with the machine's load
(by up to 1.7x within minutes here); instruction counts do not, so this is
the figure to compare two commits of the engine with.

The measured program (this script with ``--run N``) makes one run of
``bench_engine.one_run`` on a ``MemoryStore``: N steps, each one provider
turn that calls the trivial ``echo`` tool and then the tool's result, as
``bench_engine.py`` defines a step, and a final text answer.  It runs under
``valgrind --tool=callgrind`` with ``PYTHONHASHSEED=0`` (hash randomisation
alone moves a count by about 1%) twice, with N steps and with 0, and the
figure is the difference: the interpreter's start-up and the imports cancel.
It runs once without valgrind first, so that both measured runs find the
bytecode compiled.  The tree measured goes first on ``PYTHONPATH`` and the
program checks that its ``trio_backplane`` is the one imported, every module
of it from that tree (an editable install fills in, from its own checkout,
a module the tree lacks).

``--at REV`` measures another commit: REV is checked out into a temporary
``git worktree`` (removed afterwards).  The workload stays this checkout's
``bench_engine.py``, so both sides run the same program; its module-level
imports must therefore exist at every commit measured, back to ``aab4fe9``
(the baseline a later issue compares against).

The optional C extensions (``trio_backplane/schema/_speedups*.so``, the
schema input check, and ``trio_backplane/kernel/_speedups*.so``, the kernel's
``freeze``) are built in place and not in git.  This checkout uses its own
builds when there are some.  For REV each one is copied from this checkout
when REV has the same source, so both sides run the same C code; REV without
the source never imports it (its own pure Python is what it ships); REV with
another source runs its pure-Python fallback, and the script prints the
command that measures this checkout the same way (``--pure-python``, which
blocks every extension).

One measurement (a run outside valgrind, then two callgrind runs: most of
the time is the interpreter's start-up under valgrind) takes 30-50 s here,
whatever ``--steps``.  Needs valgrind on PATH (``apt-get install valgrind``).
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASELINE = "aab4fe9"
#: The optional C extensions: module name -> its source.
SPEEDUPS: dict[str, str] = {
    "trio_backplane.schema._speedups": "trio_backplane/schema/_speedups.c",
    "trio_backplane.kernel._speedups": "trio_backplane/kernel/_speedups.c",
}
MARK = "measured tree:"
PURE_NOTE = "none: --pure-python (the pure-Python fallback)"
FOREIGN = "foreign module:"


class Failure(Exception):
    """A measurement that cannot be made; the message says why."""


# -- the measured program ----------------------------------------------------------


def store_chain(total: int) -> tuple[Any, list[tuple[Any, Any, Any]]]:
    """The ``store`` workload's first record and ``total`` kernel transitions
    of its run: ``(old, new, events)``, alternating ``provider_started`` and
    ``provider_completed`` (one message appended to the transcript)."""
    from trio_backplane.kernel import Command, FrozenList, RunRecord, freeze, transition

    first = RunRecord.new("instructions", work=10**6)
    record, chain = first, []
    for n in range(total):
        if record.state == "queued":
            command = Command("admit", 0.0, {"state": "running"})
        elif record.active_provider is None:
            command = Command("provider_started", float(n))
        else:
            text = f"reply {n}: " + "lorem ipsum " * 8
            message = freeze({"role": "assistant", "content": text})
            command = Command(
                "provider_completed",
                float(n),
                {"result": {"text": text}, "messages": FrozenList((message,))},
            )
        new, events = transition(record, command)
        chain.append((record, new, events))
        record = new
    return first, chain


def store_commits(count: int, total: int) -> None:
    """The ``store`` workload: ``total`` kernel transitions of one run made
    first (the same in every run of the program, :func:`store_chain`), then
    the first ``count`` committed to a ``SQLiteStore``, one after the other:
    what a store costs a commit, without the engine."""
    import trio

    from trio_backplane.store import SQLiteStore

    first, chain = store_chain(total)

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="instructions-store-") as root:
            store = SQLiteStore(Path(root) / "runs.db")
            await store.create(first)
            for old, new, events in chain[:count]:
                await store.commit(
                    old.run_id,
                    incarnation=old.incarnation,
                    expected_revision=old.revision,
                    record=new,
                    events=events,
                )
            await store.aclose()

    trio.run(main)


def raw_commits(count: int, total: int) -> None:
    """The ``raw`` workload: the ``store`` workload's rows (head, changed
    parts, events), diffed and encoded before counting starts, the first
    ``count`` commits written by ``bench_store.raw_loop`` (the same
    statements and durability settings, in one thread, no store code): the
    floor of the ``store`` workload's SQL."""
    from bench_store import open_raw, raw_create, raw_loop

    from trio_backplane.kernel import encode_event
    from trio_backplane.store._diff import NOTHING, diff
    from trio_backplane.store._layout import head_text

    first, chain = store_chain(total)
    entry = diff(NOTHING, first)[0]
    plan = []
    for old, new, events in chain:
        entry, upserts, _deletes = diff(entry, new)
        plan.append((old, new, head_text(new), upserts, [encode_event(e) for e in events]))
    with tempfile.TemporaryDirectory(prefix="instructions-raw-") as root:
        conn = open_raw(Path(root) / "raw.db")
        raw_create(conn, first)
        if count:
            raw_loop(conn, plan[:count])
        conn.close()


def engine_on_sqlite(steps: int) -> None:
    """The ``engine-sqlite`` workload: the engine's run of ``steps`` steps on
    a ``SQLiteStore`` in a temporary directory; every thread's instructions
    count (the writer thread's too), the disk's waits do not."""
    import trio
    from bench_engine import one_run

    from trio_backplane.store import SQLiteStore

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="instructions-sqlite-") as root:
            async with SQLiteStore(Path(root) / "runs.db") as store:
                await one_run(store, "instructions", steps)

    trio.run(main)


def handoffs(count: int) -> None:
    """The ``handoff`` workload: ``count`` round trips doing nothing through
    a ``SQLiteStore``'s worker thread, on the path a commit batch takes (the
    worker's queue in, the wake-up pipe out): what any store keeping its
    blocking calls off the Trio thread pays a commit, at least."""
    import trio

    from trio_backplane.store import SQLiteStore

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="instructions-handoff-") as root:
            store = SQLiteStore(Path(root) / "runs.db")
            workers = store._workers  # the engine's own seam
            for _ in range(count):
                await workers.run(lambda driver: None, withdrawable=False, wake=True, writer=True)
            await store.aclose()

    trio.run(main)


def compiles(count: int) -> None:
    """The ``compile`` workload: ``count`` compiles of the schemas of
    ``workloads/schemas.json`` (beside this script), taking them in turn,
    the compiled-schema cache emptied before each, so every one pays the
    fingerprint, the preflight and the engine's build.  Each schema is
    compiled once first, in every run alike: what the first compile of a
    process sets up once cancels.  Public API only (``--at`` an older tree)."""
    import json

    from trio_backplane import schema

    documents = [
        work["schema"]
        for work in json.loads((HERE / "workloads/schemas.json").read_text()).values()
    ]
    for document in documents:
        schema.compile(document)
    for n in range(count):
        schema.cache_clear()
        schema.compile(documents[n % len(documents)])


def with_otel(sdk: bool) -> None:
    """Import OpenTelemetry's API (a host that uses it elsewhere); with
    ``sdk``, configure SDK tracer and meter providers globally (spans are
    built and ended; no exporter)."""
    from opentelemetry import metrics, trace

    if sdk:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
        metrics.set_meter_provider(MeterProvider())


def measured(steps: int, pure: bool, check: bool, workload: str, total: int) -> None:
    """One run of ``steps`` tool steps on a MemoryStore (the ``engine``
    workload; ``engine-sqlite``: :func:`engine_on_sqlite`; ``store``:
    :func:`store_commits`; ``raw``: :func:`raw_commits`; ``compile``:
    :func:`compiles`), then one line naming the ``trio_backplane`` imported
    and which of its C extensions were loaded (printed in every run alike,
    so its cost cancels).  ``check`` (the run
    outside valgrind) also prints the package's modules loaded from outside
    its directory: the editable install's finder fills in, from the checkout
    it was installed from, any module an older tree lacks."""
    if pure:
        # A None entry makes ``import`` fail: the package falls back to Python.
        for name in SPEEDUPS:
            sys.modules[name] = None  # type: ignore[assignment]
    import trio
    from bench_engine import one_run

    import trio_backplane
    from trio_backplane.store import MemoryStore

    if workload == "store":
        store_commits(steps, total)
    elif workload == "raw":
        raw_commits(steps, total)
    elif workload == "handoff":
        handoffs(steps)
    elif workload == "compile":
        compiles(steps)
    elif workload.startswith("otel"):
        with_otel(workload == "otel-sdk")
        trio.run(one_run, MemoryStore(), "instructions", steps)
    elif workload == "engine-sqlite":
        engine_on_sqlite(steps)
    else:
        trio.run(one_run, MemoryStore(), "instructions", steps)
    loaded = ",".join(sorted(name for name in SPEEDUPS if sys.modules.get(name) is not None))
    package = Path(trio_backplane.__file__).resolve().parent
    if check:
        for name, module in sorted(sys.modules.items()):
            origin = getattr(module, "__file__", None)
            inside = origin is None or Path(origin).resolve().is_relative_to(package)
            if name.startswith("trio_backplane.") and not inside:
                print(f"{FOREIGN} {name} {origin}")
    print(f"{MARK} {package} C={loaded or 'none'}")


# -- the trees -----------------------------------------------------------------------


@dataclass
class Tree:
    """A tree to measure: its root goes first on PYTHONPATH."""

    root: Path
    label: str
    pure: bool
    #: the extensions the program must load (none with ``pure``)
    loads: frozenset[str]
    extension: str


def git(*args: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise Failure(f"git {shlex.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def git_source(commit: str, path: str) -> bytes | None:
    """The bytes of ``path`` at ``commit``, None when it has no such file."""
    result = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True, check=False
    )
    return result.stdout if result.returncode == 0 else None


def built_extension(root: Path, name: str) -> Path | None:
    """The extension ``name`` this interpreter would load from ``root``, if built."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    path = root / (name.replace(".", "/") + suffix)
    return path if path.is_file() else None


def describe(commit: str) -> str:
    return git("log", "-1", "--format=%h (committed %cs)", commit)


def stale_note(root: Path, name: str, extension: Path) -> str:
    source = root / SPEEDUPS[name]
    if source.is_file() and source.stat().st_mtime > extension.stat().st_mtime:
        return f"; WARNING: older than {SPEEDUPS[name]}, rebuild it (pip install -e .)"
    return ""


def this_checkout(pure: bool) -> Tree:
    try:
        head = describe("HEAD")
        dirty = git("status", "--porcelain", "--", "trio_backplane")
        label = f"this checkout, {ROOT}, at {head}"
        if dirty:
            label += ", with uncommitted changes in trio_backplane/"
    except (Failure, OSError):
        label = f"this checkout, {ROOT} (not a git checkout)"
    if pure:
        return Tree(
            ROOT, label, True, frozenset(), "none: --pure-python (the pure-Python fallback)"
        )
    notes, loads = [], set()
    for name in SPEEDUPS:
        extension = built_extension(ROOT, name)
        if extension is None:
            notes.append(f"{name}: none built in this checkout (the pure-Python fallback)")
        else:
            loads.add(name)
            notes.append(
                f"{name}: {extension.name}, built in place{stale_note(ROOT, name, extension)}"
            )
    return Tree(ROOT, label, False, frozenset(loads), "; ".join(notes))


@contextmanager
def worktree_at(rev: str, pure: bool, rerun: list[str]) -> Iterator[Tree]:
    """REV checked out in a temporary worktree, with this checkout's C
    extensions copied in where REV has the same source."""
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except Failure:
        raise Failure(f"{rev!r} names no commit of {ROOT}") from None
    label = f"{describe(commit)}, checked out from {ROOT}"
    scratch = Path(tempfile.mkdtemp(prefix="trio_backplane-instructions-"))
    root = scratch / "tree"
    try:
        git("worktree", "add", "--detach", "--quiet", str(root), commit)
        yield extensions_at(rev, commit, root, pure=pure, rerun=rerun, label=label)
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(root)],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(scratch, ignore_errors=True)
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True, check=False
        )


def extensions_at(
    rev: str, commit: str, root: Path, *, pure: bool, rerun: list[str], label: str
) -> Tree:
    """The tree of REV in ``root``, with each of this checkout's built
    extensions copied in when REV has the same source."""
    if pure:
        return Tree(
            root, label, True, frozenset(), "none: --pure-python (the pure-Python fallback)"
        )
    notes, loads, fallback = [], set(), False
    for name, source in SPEEDUPS.items():
        theirs = git_source(commit, source)
        extension = built_extension(ROOT, name)
        here = ROOT / source
        if theirs is None:
            notes.append(f"{name}: {rev} has no {source} (it does not use it)")
        elif extension is None:
            fallback = True
            notes.append(f"{name}: this checkout has no build to copy (the pure-Python fallback)")
        elif not here.is_file() or theirs != here.read_bytes():
            fallback = True
            notes.append(
                f"{name}: {rev}'s {source} differs from this checkout's, so {rev} runs"
                f" the pure-Python fallback; measure this checkout the same way:"
                f" {shlex.join([*rerun, '--pure-python'])}"
            )
        else:
            shutil.copy2(extension, root / extension.relative_to(ROOT))
            loads.add(name)
            notes.append(
                f"{name}: {extension.name} copied from {ROOT} (the same source"
                f"{stale_note(ROOT, name, extension)})"
            )
    if fallback:
        # a partial set would mix C and Python: REV runs its own Python alone
        for name in loads:
            (root / built_extension(ROOT, name).relative_to(ROOT)).unlink()  # type: ignore[union-attr]
        loads = set()
    return Tree(root, label, fallback, frozenset(loads), "; ".join(notes))


# -- the measurement -----------------------------------------------------------------


def program(
    tree: Tree, steps: int, check: bool = False, workload: str = "engine", total: int = 0
) -> tuple[list[str], dict[str, str]]:
    """The measured program's command and environment for ``steps`` steps."""
    command = [sys.executable, str(Path(__file__).resolve()), "--run", str(steps)]
    if workload != "engine":
        command += ["--workload", workload, "--total", str(total)]
    if check:
        command.append("--check")
    if tree.pure:
        command.append("--pure-python")
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(tree.root)}
    return command, env


def shown(command: list[str], env: dict[str, str]) -> str:
    """``command`` as a shell line, with the variables this script sets."""
    fixed = [f"{name}={shlex.quote(env[name])}" for name in ("PYTHONHASHSEED", "PYTHONPATH")]
    return " ".join([*fixed, shlex.join(command)])


def check_line(tree: Tree, stdout: str) -> None:
    """The measured program imported the tree's package, as expected."""
    lines = [line for line in stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        raise Failure(f"the measured program printed no {MARK!r} line:\n{stdout}")
    foreign = [
        line[len(FOREIGN) :].strip() for line in stdout.splitlines() if line.startswith(FOREIGN)
    ]
    if foreign:
        raise Failure(
            f"modules imported from outside {tree.root} (the tree lacks them; the editable"
            " install filled them in): " + "; ".join(foreign)
        )
    package, _, loaded = lines[-1][len(MARK) :].strip().rpartition(" C=")
    names = frozenset() if loaded == "none" else frozenset(loaded.split(","))
    expected = (tree.root / "trio_backplane").resolve()
    if Path(package) != expected:
        raise Failure(f"trio_backplane was imported from {package}, not from {expected}")
    if names != tree.loads:
        raise Failure(f"the C extensions loaded were {sorted(names)}, against {tree.extension!r}")


def failed(what: str, result: subprocess.CompletedProcess[str]) -> Failure:
    """The measured program's own error output (valgrind's lines dropped)."""
    lines = [line for line in result.stderr.splitlines() if not line.startswith("==")]
    tail = "\n".join(lines[-25:])
    return Failure(
        f"{what} failed (exit status {result.returncode}):\n{tail}\n"
        f"The measured program imports bench_engine.py from {HERE}: its module-level"
        f" imports must exist in every tree measured, back to {BASELINE}."
    )


def warm_up(tree: Tree, steps: int, workload: str) -> None:
    """One run outside valgrind: it compiles the bytecode both measured runs
    then find, and checks which package and extension the program loads."""
    command, env = program(tree, steps, check=True, workload=workload, total=steps)
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise failed(f"the measured program ({steps} steps, no valgrind)", result)
    check_line(tree, result.stdout)


def callgrind(
    valgrind: str, tree: Tree, steps: int, *, scratch: Path, workload: str, total: int
) -> tuple[int, str]:
    """Instructions of the measured program's run of ``steps`` steps, and the
    command that counted them."""
    out = scratch / f"callgrind.out.{steps}"
    command, env = program(tree, steps, workload=workload, total=total)
    command = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", *command]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise failed(f"the callgrind run of {steps} steps", result)
    check_line(tree, result.stdout)
    for line in out.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1]), shown(command, env)
    raise Failure(f"no totals in {out}")


def valgrind_version(valgrind: str) -> str:
    result = subprocess.run([valgrind, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.strip() or "valgrind"


def display_command(argv: list[str]) -> list[str]:
    """How this script was invoked, paths relative to the repository root
    when they lie inside it."""

    def near(path: str) -> str:
        absolute = Path(os.path.abspath(path))  # not resolved: .venv/bin/python is a link
        return str(absolute.relative_to(ROOT)) if absolute.is_relative_to(ROOT) else path

    return [near(sys.executable), near(__file__), *argv]


def measure(
    valgrind: str, tree: Tree, steps: int, command: list[str], workload: str = "engine"
) -> None:
    start = time.monotonic()
    print(
        f"callgrind instruction count, python {platform.python_version()},"
        f" {valgrind_version(valgrind)}, PYTHONHASHSEED=0",
        flush=True,
    )
    print(f"tree: {tree.label}")
    print(f"C extensions: {tree.extension}", flush=True)
    print(f"workload: {workload}", flush=True)
    warm_up(tree, steps, workload)
    print(f"trio_backplane imported from {(tree.root / 'trio_backplane').resolve()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="trio_backplane-callgrind-") as name:
        scratch = Path(name)
        run = functools.partial(callgrind, valgrind, tree, scratch=scratch, workload=workload)
        base, base_command = run(0, total=steps)
        print(f"  0-step run: {base / 1e6:10.1f} M instructions: {base_command}", flush=True)
        total, total_command = run(steps, total=steps)
        print(f"  {steps}-step run: {total / 1e6:10.1f} M instructions: {total_command}")
    figure = total - base
    units = {"store": "commit", "raw": "commit", "handoff": "round trip", "compile": "compile"}
    unit = units.get(workload, "step")
    print(
        f"{steps} {unit}s: {figure / 1e6:.1f} M instructions"
        f" ({figure / steps / 1e6:.3f} M a {unit};"
        f" measured in {time.monotonic() - start:.0f} s)"
    )
    print(f"command (from {ROOT}): {shlex.join(command)}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description="Instructions of N engine tool-call steps (MemoryStore), under callgrind."
    )
    parser.add_argument(
        "--steps", type=int, default=200, metavar="N", help="steps measured (default 200)"
    )
    parser.add_argument(
        "--at",
        metavar="REV",
        help=f"measure this commit instead of this checkout (e.g. {BASELINE}, HEAD)",
    )
    parser.add_argument(
        "--pure-python",
        action="store_true",
        help="block the C extensions: measure the pure-Python fallback",
    )
    parser.add_argument(
        "--workload",
        choices=(
            "engine",
            "engine-sqlite",
            "otel-api",
            "otel-sdk",
            "store",
            "raw",
            "handoff",
            "compile",
        ),
        default="engine",
        help="engine: N tool steps on a MemoryStore (default); engine-sqlite: the same on a"
        " SQLiteStore (every thread's instructions); store: N SQLiteStore commits"
        " of precomputed records, no engine; raw: the same commits' rows written by"
        " bench_store's raw sqlite3 loop (the store's SQL floor; this checkout only);"
        " handoff: N bare round trips through the SQLiteStore's worker thread (this"
        " checkout's engine only); compile: N uncached"
        " schema compiles of benchmarks/workloads/schemas.json, in turn (an even N"
        " weighs them alike); otel-api: the engine with opentelemetry-api imported and no"
        " SDK configured (a conversation then records nothing); otel-sdk: the engine with"
        " an SDK tracer and meter provider configured globally, recording every span",
    )
    parser.add_argument("--total", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--run", type=int, metavar="N", help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run is not None:
        measured(args.run, args.pure_python, args.check, args.workload, args.total)
        return 0
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        sys.exit(
            "instructions.py: valgrind is not on PATH; install it"
            " (Debian/Ubuntu: sudo apt-get install valgrind) and run again"
        )
    command = display_command(argv)
    try:
        if args.at is None:
            tree = this_checkout(args.pure_python)
            measure(valgrind, tree, args.steps, command, args.workload)
        else:
            rerun = display_command(
                ([] if args.steps == 200 else ["--steps", str(args.steps)])
                + ([] if args.workload == "engine" else ["--workload", args.workload])
            )
            with worktree_at(args.at, args.pure_python, rerun) as tree:
                measure(valgrind, tree, args.steps, command, args.workload)
    except Failure as error:
        sys.exit(f"instructions.py: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
