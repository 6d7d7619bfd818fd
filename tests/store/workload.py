"""The store workload the benchmarks commit, one command at a time."""

from __future__ import annotations

from trio_backplane.kernel import Command, FrozenList, RunRecord, freeze


def next_turn(record: RunRecord, n: int, content: str) -> Command:
    """The command after ``record``: admission, then provider turns, each
    completed turn appending one assistant message of ``content``."""
    if record.state == "queued":
        return Command("admit", 0.0, {"state": "running"})
    if record.active_provider is None:
        return Command("provider_started", float(n))
    message = freeze({"role": "assistant", "content": content})
    fields = {"result": {"text": "x"}, "messages": FrozenList((message,))}
    return Command("provider_completed", float(n), fields)
