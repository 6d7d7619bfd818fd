"""``backplane runs list|show|recover STORE_URL``: read the runs of a store."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import attrs
import trio

from .._numbers import iso_instant
from ..errors import Error, ErrorClass
from ..kernel import RUN_STATES, encode_record, thaw
from ..recovery import RecoveryReport, Settled, recover, settle_run
from ..resources import kill_orphans
from . import _fleet
from ._output import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, Out, clean, error_text, reason, short
from ._urls import UsageError, hide_dsn_secret, open_store


def add_parser(commands: Any) -> None:
    """Add ``runs list``, ``runs show`` and ``runs recover`` to the top-level ``commands``."""
    runs_cmd = commands.add_parser(
        "runs",
        help="inspect the runs of a store",
        description="STORE_URL is sqlite:///relative/path, sqlite:////absolute/path, a bare "
        "path, or a postgresql:// DSN.",
    )
    runs_sub = runs_cmd.add_subparsers(dest="runs_command", required=True)
    runs_list = runs_sub.add_parser("list", help="every run: state, incarnation, revision, work")
    runs_list.add_argument("store", metavar="STORE_URL")
    runs_list.add_argument(
        "--state",
        action="append",
        metavar="STATE",
        choices=sorted(RUN_STATES),
        help="only runs in STATE (repeatable): " + ", ".join(sorted(RUN_STATES)),
    )
    runs_show = runs_sub.add_parser(
        "show", help="one run: transcript, intents (status, effect_class), outcome, budget"
    )
    runs_show.add_argument("store", metavar="STORE_URL")
    runs_show.add_argument("run_id", metavar="RUN_ID")
    runs_recover = _add_recover(runs_sub)
    for command in (runs_list, runs_show, runs_recover):
        command.add_argument("--json", action="store_true", help="print JSON instead of tables")
        command.set_defaults(handler=runs_command)
    _fleet.add_runs(runs_sub)


def _add_recover(runs_sub: Any) -> Any:
    """``runs recover`` and its options."""
    runs_recover = runs_sub.add_parser(
        "recover",
        help="the recovery classification of a run (read-only unless --fence)",
    )
    runs_recover.add_argument("store", metavar="STORE_URL")
    runs_recover.add_argument("run_id", metavar="RUN_ID")
    runs_recover.add_argument(
        "--incarnation",
        type=int,
        metavar="N",
        help="the recovering incarnation (default: the stored one + 1)",
    )
    runs_recover.add_argument(
        "--fence",
        action="store_true",
        help="also fence the stored incarnation (Store.fence): it can never commit again",
    )
    runs_recover.add_argument(
        "--settle",
        action="store_true",
        help="fence the stored incarnation and commit the run's outcome: cancelled "
        "(stop reason recovered) when nothing in flight may have changed the world, "
        "else unknown_outcome with its evidence; never a replay",
    )
    runs_recover.add_argument(
        "--continue",
        dest="continue_run",
        action="store_true",
        help="fence the run and go on with --agent of --app: resumed where it "
        "stopped (the time it had left), or settled and replaced by a run fed its "
        "committed transcript; refused if anything in flight may have changed the world",
    )
    runs_recover.add_argument("--app", metavar="MODULE", help="package.module[:app] (--continue)")
    runs_recover.add_argument("--agent", metavar="NAME", help="the app's agent (--continue)")
    runs_recover.add_argument(
        "--kill-orphans",
        action="store_true",
        help="stop the process groups the run's commands left alive on this host "
        "(each leader's start time checked) and say which",
    )
    return runs_recover


def runs_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run one ``runs`` subcommand; status 2 for a store URL that names no store."""
    try:
        _check_run_id(getattr(args, "run_id", None))
        fencing = args.runs_command == "recover" and (
            args.fence or args.settle or args.continue_run
        )
        store = open_store(args.store, writing=fencing)
    except UsageError as exc:
        print(hide_dsn_secret(f"backplane: {exc}", args.store), file=sys.stderr)
        return EXIT_USAGE
    handler = {"list": _list, "show": _show, "recover": _recover}[args.runs_command]
    view = Out(out)
    try:
        status: int = trio.run(_with_store, store, handler, args, view)
    except Error as error:
        view.stop()
        print(hide_dsn_secret(f"backplane: {reason(error)}", args.store), file=sys.stderr)
        # a database that holds no store is a usage mistake, as a SQLite file is
        return EXIT_USAGE if error.details.get("reason") == "not_a_store" else EXIT_REJECTED
    return status


def _check_run_id(run_id: str | None) -> None:
    """Refuse a run id that is not UTF-8 (``$'caf\\xe9'`` arrives with
    surrogate escapes): it can name no stored run."""
    if run_id is None:
        return
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"run id {clean(ascii(run_id))} is not valid UTF-8") from None


async def _with_store(store: Any, handler: Any, args: argparse.Namespace, out: Out) -> int:
    async with store:
        status: int = await handler(store, args, out)
        return status


async def _load(store: Any, run_id: str) -> Any:
    record = await store.load(run_id)
    if record is None:
        raise Error(ErrorClass.NOT_FOUND, f"no run {run_id!r} in the store")
    return record


# -- runs list ----------------------------------------------------------------------


async def _list(store: Any, args: argparse.Namespace, out: Out) -> int:
    """Every run, one row each; a run whose stored rows cannot be read is
    listed from its summary (``unreadable``), said on standard error, and
    makes the status 1.  A failure of the store itself fails the listing."""
    out.spin("listing runs…")
    summaries = await store.list_runs(states=args.state or None)
    out.stop()
    listed: list[tuple[tuple[Any, ...], Error | None]] = []
    with out.progress("reading runs", len(summaries)) as advance:
        for summary in summaries:
            record, error = await _listed(store, summary.run_id)
            advance()
            row: tuple[Any, ...] = (
                summary.run_id,
                summary.state,
                summary.incarnation,
                summary.revision,
            )
            if record is None:
                row += ("?", "?" if error is not None else 0)
            else:
                row += (f"{record.budget.used}/{record.budget.quota}", len(record.transcript))
            listed.append((row, error))
    unreadable = [error for _, error in listed if error is not None]
    if args.json:
        keys = ("run_id", "state", "incarnation", "revision", "work", "messages")
        items = []
        for row, error in listed:
            item = dict(zip(keys, row, strict=True))
            if error is not None:
                item.update(work=None, messages=None, unreadable=reason(error))
            items.append(item)
        out.file.write(json.dumps(items, indent=2) + "\n")
    else:
        out.table(
            "runs",
            ("run id", "state", "incarnation", "revision", "work", "messages"),
            [row for row, _ in listed],
            caption=f"{len(listed)} runs",
        )
    for error in unreadable:
        print(hide_dsn_secret(f"backplane: {reason(error)}", args.store), file=sys.stderr)
    return EXIT_REJECTED if unreadable else EXIT_OK


async def _listed(store: Any, run_id: str) -> tuple[Any, Error | None]:
    """``run_id``'s record (``None``: gone since listed), or the error that
    names this run alone (rows damaged, or written by a newer version)."""
    try:
        return await store.load(run_id), None
    except Error as error:
        if error.details.get("run_id") != run_id:  # the store failed, not this run
            raise
        return None, error


# -- runs show ----------------------------------------------------------------------


async def _show(store: Any, args: argparse.Namespace, out: Out) -> int:
    out.spin("loading the run…")
    record = await _load(store, args.run_id)
    events = await store.events(args.run_id)
    out.stop()
    if args.json:
        out.file.write(json.dumps(encode_record(record), indent=2, default=str) + "\n")
        return EXIT_OK
    out.table(f"run {record.run_id}", ("", ""), _summary_rows(record, events), header=False)
    out.table("transcript", ("role", "content"), _transcript_rows(record.transcript))
    out.table(
        "intents",
        ("effect", "kind", "tool", "status", "effect_class", "dispatch_state"),
        _intent_rows(record),
    )
    _show_outcome(out, record)
    return EXIT_OK


def _summary_rows(record: Any, events: Sequence[Any]) -> list[tuple[str, str]]:
    budget = record.budget
    reservations = ", ".join(sorted(budget.reservations)) or "none"
    return [
        ("state", record.state),
        ("incarnation", str(record.incarnation)),
        ("revision", str(record.revision)),
        ("deadline", iso_instant(record.deadline)),
        ("budget", f"{budget.used} of {budget.quota} used; reservations: {reservations}"),
        ("stop reason", record.stop_reason or "-"),
        ("stored events", f"{len(events)}"),
    ]


def _transcript_rows(messages: Sequence[Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            rows.append(("?", short(message)))
            continue
        role = str(message.get("role", "?"))
        if role == "tool":
            rows.append((f"tool {clean(message.get('name'))}", _tool_result(message)))
            continue
        content = message.get("content")
        if isinstance(content, str):
            rows.append((role, short(content, 400)))
        elif not isinstance(content, list | tuple):
            rows.append((role, short(content)))
        else:
            rows.extend((role, _block_text(block)) for block in content)
    return rows


def _tool_result(message: Mapping[str, Any]) -> str:
    result = message.get("result")
    if not isinstance(result, Mapping):  # a host's own shape: shown as it is
        return short(result, 200)
    if result.get("is_error"):
        return "✗ " + (error_text(result.get("error")) or short(result.get("content")))
    return "✓ " + short(result.get("content"), 200)


def _block_text(block: Any) -> str:
    if isinstance(block, Mapping) and block.get("type") == "tool_call":
        return f"→ {block.get('name')} {short(block.get('arguments'))}"
    if isinstance(block, Mapping) and "text" in block:
        return short(block.get("text"), 400)
    return short(block)


def _intent_rows(record: Any) -> list[tuple[Any, ...]]:
    rows = []
    for effect_id in sorted(record.intents, key=_effect_order):
        intent = record.intents[effect_id]
        rows.append(
            (
                effect_id,
                intent.get("kind", effect_id.split(":", 1)[0]),
                intent.get("tool_name") or "-",
                intent.get("status", "?"),
                intent.get("effect_class", "?"),
                intent.get("dispatch_state", "-"),
            )
        )
    return rows


def _effect_order(effect_id: str) -> tuple[int, str]:
    digits = re.findall(r"\d+", effect_id)
    return (int(digits[-1]) if digits else 0, effect_id)


def _show_outcome(out: Out, record: Any) -> None:
    outcome = thaw(record.outcome) if record.outcome is not None else None
    if outcome is None:
        out.line(("outcome ", "bold"), "none yet (the run is not terminal)")
        return
    status = str(outcome.get("status", record.state))
    error = outcome.get("error")
    out.line(
        ("outcome ", "bold"),
        (status, "bold green" if status == "completed" else "bold red"),
        f"  turn {outcome.get('turn_id')}" if outcome.get("turn_id") else "",
        f"  {error_text(error)}" if error else "",
    )


# -- runs recover -------------------------------------------------------------------


async def _recover(store: Any, args: argparse.Namespace, out: Out) -> int:
    record = await _load(store, args.run_id)
    incarnation = args.incarnation if args.incarnation is not None else record.incarnation + 1
    report = recover(record, incarnation=incarnation)
    if args.json:
        data = attrs.asdict(report)
        data["safe_to_withdraw"] = report.safe_to_withdraw
        out.file.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        _show_report(out, report)
    if args.kill_orphans:
        _show_orphans(out, await kill_orphans(report.resources), json_output=args.json)
    if args.continue_run:
        went_on, state = await _fleet.continue_from(store, args)
        if went_on == args.run_id:
            _say(out, args.json, f"continued: {args.run_id} resumed where it stopped, {state}")
        else:
            text = f"continued: {args.run_id} settled, its replacement {went_on} {state}"
            _say(out, args.json, text)
    elif args.settle:
        settled = await settle_run(store, args.run_id, incarnation=incarnation)
        _say(out, args.json, _settled_text(settled))
    elif args.fence:
        receipt = await store.fence(args.run_id, incarnation=incarnation)
        message = (
            f"fenced: incarnation {record.incarnation} can no longer commit; the run is at "
            f"incarnation {receipt.incarnation}, revision {receipt.revision}"
        )
        if args.json:
            print(message, file=sys.stderr)
        else:
            out.line(("  " + message, "bold yellow"))
    elif not args.json:
        out.line(
            (
                f"  read-only: nothing was fenced (pass --fence to fence incarnation "
                f"{record.incarnation})",
                "dim",
            )
        )
    return EXIT_OK


def _settled_text(settled: Settled) -> str:
    record = settled.record
    if not settled.committed:
        return f"settled already: the run is {record.state}; nothing was committed"
    evidence = len((record.outcome or {}).get("evidence") or ())
    why = f", {evidence} evidence item(s)" if evidence else ""
    return (
        f"settled: incarnation {settled.fenced} fenced; the run is now {record.state} "
        f"(stop reason {record.stop_reason}{why})"
    )


def _say(out: Out, json_output: bool, message: str) -> None:
    if json_output:
        print(message, file=sys.stderr)
    else:
        out.line(("  " + message, "bold yellow"))


def _show_orphans(out: Out, reports: list[dict[str, Any]], *, json_output: bool) -> None:
    """One line per recorded process group: killed, gone, skipped or alive."""
    if json_output:
        print(json.dumps({"orphans": reports}), file=sys.stderr)
        return
    if not reports:
        out.line("  orphans: the run recorded no process group")
    for item in reports:
        why = f" ({item['reason']})" if item.get("reason") else ""
        style = "bold red" if item["status"] == "alive" else "bold yellow"
        out.line(
            (f"  orphan process group {item['pgid']} ", "dim"), (f"{item['status']}{why}", style)
        )


def _show_report(out: Out, report: RecoveryReport) -> None:
    out.line(
        ("recovery of ", "bold"),
        (report.run_id, "bold cyan"),
        f"  for incarnation {report.incarnation} (fences incarnation {report.fenced_incarnation})",
    )
    out.line(("  state ", "dim"), report.state, ("  terminal" if report.terminal else "", "dim"))
    if report.effects:
        _show_effects(out, report)
    elif not any(report.unsettled.get(k) for k in ("children", "dependencies")):
        out.line("  no outstanding effects: nothing to withdraw, resume or reconcile")
    else:
        out.line("  no outstanding effects")
    for kind in ("children", "dependencies"):
        if report.unsettled.get(kind):
            out.line(
                (f"  unsettled {kind} (settle before resuming) ", "bold yellow"),
                ", ".join(report.unsettled[kind]),
            )
    if report.uncertain_effects:
        out.line(
            ("  uncertain (reconcile by hand) ", "bold red"),
            ", ".join(report.uncertain_effects),
        )
    for item in report.resources:
        out.line(
            ("  recorded ", "dim"),
            f"{item.get('kind')} {item.get('pgid')} on {item.get('host')}"
            f" (session {item.get('session_id')}; --kill-orphans stops it if alive)",
        )


def _show_effects(out: Out, report: RecoveryReport) -> None:
    out.table(
        "outstanding effects",
        ("effect", "kind", "effect_class", "dispatch_state", "status", "withdraw", "resume"),
        [
            (
                e.effect_id,
                e.kind,
                e.effect_class,
                e.dispatch_state,
                e.status,
                "safe" if e.safe_to_withdraw else "no",
                "safe" if e.safe_to_resume else "no",
            )
            for e in report.effects
        ],
    )
