"""The kernel against a small independent model (KER-01..08, KER-12, KER-13).

Hypothesis drives ``transition`` (and ``fence``) with random commands, valid
and invalid: unknown kinds, stale attempt, invocation, step and wait ids,
foreign runs, stale or newer incarnations, times before and after the
deadline.  The model is plain Python and decides, before the kernel runs,
whether the command must be accepted and, if not, with which error class.
"""

from __future__ import annotations

from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trio_backplane.errors import ErrorClass
from trio_backplane.kernel import Command, RunRecord, fence, thaw, transition

from .support import AFTER_DEADLINE, KINDS, RUN, outcome_of

V, C, T, B = (
    ErrorClass.VALIDATION,
    ErrorClass.RESOURCE_CONFLICT,
    ErrorClass.TIMEOUT,
    ErrorClass.BUDGET_EXCEEDED,
)
ACTIVE = {"queued", "running", "waiting_approval", "waiting_result"}
TERMINAL = {"completed", "failed", "cancelled", "timed_out", "unknown_outcome"}
INTENT_STATUSES = {"started", "consumed", "cancelled", "uncertain"}
ADVANCE = st.sampled_from([0.0, 0.0, 0.0, 0.0, 0.5, 2.0, 10.0])
SKEW = st.sampled_from([0.0, 0.0, 0.0, 0.0, -30.0])


class Model:
    """What a run should look like, in plain Python."""

    def __init__(self, incarnation: int, quota: int) -> None:
        self.incarnation = incarnation
        self.quota = quota
        self.revision = 0
        self.state = "queued"
        self.admitted = False
        self.deadline: float | None = None
        self.counters: dict[str, int] = {}
        self.provider: str | None = None  # active attempt id
        self.step: str | None = None
        self.tools: set[str] = set()  # active invocation ids
        self.calls: set[tuple[str, str]] = set()  # (step, tool_call_id) invoked
        self.done_tools: set[str] = set()
        self.wait: tuple[str, str] | None = None  # (wait_id, dependency)
        self.dependencies: list[str] = []
        self.intents: dict[str, str] = {}  # key -> status
        self.stop_reason: str | None = None
        self.cleanup_required: dict[str, list[str]] | None = None

    @property
    def used(self) -> int:
        return len(self.intents)

    def new_id(self, kind: str) -> str:
        self.counters[kind] = self.counters.get(kind, 0) + 1
        return f"{kind}-{self.incarnation}-{self.counters[kind]}"

    def peek_id(self, kind: str) -> str:
        return f"{kind}-{self.incarnation}-{self.counters.get(kind, 0) + 1}"

    def requirements(self) -> dict[str, list[str]]:
        return {
            "provider": [self.provider] if self.provider else [],
            "tools": sorted(self.tools),
            "children": [],
            "dependencies": sorted(set(self.dependencies)),
        }

    def likely_kinds(self) -> list[str]:
        if self.state == "queued":
            return ["start" if self.admitted else "admit"]
        if self.state == "running":
            kinds = ["conversation_updated", "wait_started", "finish"]
            if self.provider:
                kinds += ["provider_completed"] * 3
            else:
                kinds += ["tool_completed"] * 2 if self.tools else ["provider_started"] * 2
                kinds += ["tool_invoked"] * 3 if self.step else []
            return kinds
        if self.state == "waiting_result":
            return ["wait_resolved", "wait_resolved", "conversation_updated"]
        if self.state == "cancelling":
            return ["cleanup_settled"]
        return list(KINDS)  # terminal: everything is refused

    def refusal(self, kind: str, given: dict[str, Any], at: float) -> ErrorClass | None:
        """The error class the kernel must raise, or ``None`` to accept."""
        if kind not in KINDS:
            return V
        if self.state in TERMINAL:
            return V
        if given.get("run_id", RUN) != RUN:
            return C
        if given.get("incarnation", self.incarnation) != self.incarnation:
            return C
        if self.deadline is not None and at > self.deadline and kind not in AFTER_DEADLINE:
            return T
        return getattr(self, f"check_{kind}")(given)

    # -- per command: the refusal, in the order API.md's table implies ----------

    def check_admit(self, given: dict[str, Any]) -> ErrorClass | None:
        if self.admitted or self.state != "queued":
            return V
        return None if given.get("state", "queued") in ("queued", "running") else V

    def check_start(self, given: dict[str, Any]) -> ErrorClass | None:
        return None if self.admitted and self.state in ("queued", "running") else V

    def check_conversation_updated(self, given: dict[str, Any]) -> ErrorClass | None:
        return None if self.state == "running" else V

    def check_provider_started(self, given: dict[str, Any]) -> ErrorClass | None:
        if self.state != "running":
            return V
        if self.provider or self.tools or self.wait:
            return C
        return B if self.used >= self.quota else None

    def check_provider_completed(self, given: dict[str, Any]) -> ErrorClass | None:
        if self.state != "running":
            return V
        attempt = given.get("attempt_id")
        if self.provider is None:
            return C if attempt is not None and f"provider:{attempt}" in self.intents else V
        if attempt is not None and attempt != self.provider:
            return C
        if given.get("final") is True and (self.tools or self.wait or self.dependencies):
            return C
        return None

    def check_tool_invoked(self, given: dict[str, Any]) -> ErrorClass | None:
        if self.state != "running":
            return V
        if self.provider is not None:
            return C  # KER-07
        if self.step is None:
            return V
        step = given.get("step_id", self.step)
        if step != self.step:
            return C
        if "tool_call_id" in given and (step, given["tool_call_id"]) in self.calls:
            return C
        return B if self.used >= self.quota else None

    def check_tool_completed(self, given: dict[str, Any]) -> ErrorClass | None:
        if self.state != "running":
            return V
        invocation = given.get("invocation_id")
        return None if type(invocation) is str and invocation in self.tools else C

    def check_wait_started(self, given: dict[str, Any]) -> ErrorClass | None:
        if self.state != "running":
            return V
        dependency = given.get("dependency", "")
        return None if "dependency" not in given or (type(dependency) is str and dependency) else V

    def check_wait_resolved(self, given: dict[str, Any]) -> ErrorClass | None:
        if self.state != "waiting_result":
            return V
        assert self.wait is not None
        return None if given.get("wait_id") == self.wait[0] else C

    def check_child_settled(self, given: dict[str, Any]) -> ErrorClass | None:
        return V if self.state != "running" else C  # no child is ever owned here

    def check_finish(self, given: dict[str, Any]) -> ErrorClass | None:
        if self.state != "running":
            return V
        if given.get("status") not in ("completed", "failed"):
            return V
        if not isinstance(given.get("outcome", {}), dict):
            return V
        if self.provider or self.tools or self.wait or self.dependencies:
            return C  # KER-05
        return None

    def check_stop(self, given: dict[str, Any]) -> ErrorClass | None:
        return None if self.state in ACTIVE else V

    check_cancel = check_deadline_exceeded = check_stop

    def check_cleanup_settled(self, given: dict[str, Any]) -> ErrorClass | None:
        if self.state != "cancelling":
            return V
        certainty = given.get("certainty")
        if certainty == "confirmed":
            assert self.cleanup_required is not None
            settled = given.get("settled", {})
            if not isinstance(settled, dict) or set(settled) - set(self.cleanup_required):
                return C
            for key, ids in self.cleanup_required.items():
                got = settled.get(key, [])
                if not isinstance(got, list) or not all(type(i) is str for i in got):
                    return C
                if sorted(got) != ids:
                    return C
            return None  # KER-06
        if certainty == "uncertain":
            return None if given.get("evidence") else V
        return V

    # -- acceptance ----------------------------------------------------------

    def accept(self, kind: str, given: dict[str, Any], at: float) -> None:
        self.revision += 1
        if kind == "admit":
            self.admitted = True
            self.state = given.get("state", "queued")
            self.deadline = given.get("deadline")
        elif kind == "start":
            self.state = "running"
        elif kind == "conversation_updated":
            later = given.get("execution_deadline")
            if later is not None and (self.deadline is None or later > self.deadline):
                self.deadline = later
        elif kind == "provider_started":
            self.provider = self.new_id("attempt")
            self.step = self.new_id("step")
            self.intents[f"provider:{self.provider}"] = "started"
        elif kind == "provider_completed":
            self.intents[f"provider:{self.provider}"] = "consumed"
            self.provider = None
            if given.get("final") is True:
                self.state = "completed"
        elif kind == "tool_invoked":
            invocation = self.new_id("invocation")
            self.tools.add(invocation)
            assert self.step is not None
            if "tool_call_id" in given:
                self.calls.add((self.step, given["tool_call_id"]))
            self.intents[f"tool:{invocation}"] = "started"
        elif kind == "tool_completed":
            invocation = given["invocation_id"]
            self.tools.remove(invocation)
            self.done_tools.add(invocation)
            self.intents[f"tool:{invocation}"] = "consumed"
        elif kind == "wait_started":
            wait_id = self.new_id("wait")
            self.wait = (wait_id, given.get("dependency", wait_id))
            self.dependencies.append(self.wait[1])
            self.state = "waiting_result"
        elif kind == "wait_resolved":
            assert self.wait is not None
            self.dependencies = [d for d in self.dependencies if d != self.wait[1]]
            self.wait = None
            self.state = "running"
        elif kind == "finish":
            self.state = given["status"]
        elif kind in ("cancel", "deadline_exceeded"):
            self.state = "cancelling"
            self.stop_reason = "cancelled" if kind == "cancel" else "deadline_exceeded"
            self.cleanup_required = self.requirements()
        elif kind == "cleanup_settled":
            if given["certainty"] == "confirmed":
                self.mark_started("cancelled")
                self.provider, self.tools, self.wait, self.dependencies = None, set(), None, []
                self.state = "timed_out" if self.stop_reason == "deadline_exceeded" else "cancelled"
            else:
                self.mark_started("uncertain")
                self.state = "unknown_outcome"
        else:  # pragma: no cover
            raise AssertionError(kind)

    def mark_started(self, status: str) -> None:
        for key, value in self.intents.items():
            if value == "started":
                self.intents[key] = status


class KernelMachine(RuleBasedStateMachine):
    """Drive the kernel and the model side by side."""

    record: RunRecord
    model: Model
    now: float

    @initialize(incarnation=st.integers(1, 3), quota=st.sampled_from([1, 2, 3, 5, 8, 8]))
    def fresh_run(self, incarnation: int, quota: int) -> None:
        self.record = RunRecord.new(RUN, incarnation=incarnation, work=quota)
        self.model = Model(incarnation, quota)
        self.now = 0.0

    # -- drawing commands ------------------------------------------------------

    def draw_input(self, data: st.DataObject, kind: str) -> dict[str, Any]:
        m = self.model
        draw = data.draw
        given: dict[str, Any] = {}
        if kind == "admit":
            state = draw(
                st.sampled_from(["running", "running", "queued", None, "completed", "cancelling"])
            )
            if state is not None:
                given["state"] = state
            if draw(st.booleans()):
                given["deadline"] = self.now + draw(st.sampled_from([0, 5, 30, 100, 300]))
        elif kind == "conversation_updated":
            given["conversation"] = {
                "messages": draw(st.lists(st.sampled_from(["u", "a"]), max_size=3))
            }
            if m.deadline is not None and draw(st.booleans()):
                given["execution_deadline"] = m.deadline + draw(st.integers(-10, 30))
        elif kind == "provider_completed":
            choices: list[Any] = [None, m.provider, m.peek_id("attempt"), "attempt-1-1"]
            choices += [k.removeprefix("provider:") for k in m.intents if k.startswith("provider:")]
            attempt = draw(st.sampled_from(choices))
            if attempt is not None:
                given["attempt_id"] = attempt
            given["final"] = draw(st.sampled_from([False, False, False, False, True, "yes"]))
            given["result"] = {"text": "r"}
        elif kind == "tool_invoked":
            step = draw(st.sampled_from([None, None, None, m.step, "step-9-9", m.peek_id("step")]))
            if step is not None:
                given["step_id"] = step
            call = draw(st.sampled_from([None, None, "call-1", "call-2", f"call-{m.used}"]))
            if call is not None:
                given["tool_call_id"] = call
            given["effect_class"] = draw(st.sampled_from(["read_only", "mutation"]))
        elif kind == "tool_completed":
            stale = [*sorted(m.done_tools), m.peek_id("invocation"), None, 7, ["x"], {"id": 1}]
            if m.tools and draw(st.booleans()):
                given["invocation_id"] = draw(st.sampled_from(sorted(m.tools)))
            else:
                given["invocation_id"] = draw(st.sampled_from(stale))
            given["result"] = {"content": "c"}
        elif kind == "wait_started":
            dependency = draw(st.sampled_from(["absent", "dep-a", "dep-b", "", 3, {"child": "x"}]))
            if dependency != "absent":
                given["dependency"] = dependency
        elif kind == "wait_resolved":
            current = m.wait[0] if m.wait else None
            given["wait_id"] = draw(
                st.sampled_from([current, current, m.peek_id("wait"), "wait-0-1"])
            )
        elif kind == "child_settled":
            given["child_id"] = draw(st.sampled_from(["child-1", 1]))
        elif kind == "finish":
            given["status"] = draw(
                st.sampled_from(["completed", "failed", "completed", "cancelled"])
            )
            outcome = draw(st.sampled_from([None, {"why": "done"}, {"status": "x"}, "text", 4]))
            if outcome is not None:
                given["outcome"] = outcome
        elif kind == "cleanup_settled":
            required = m.cleanup_required or m.requirements()
            variant = draw(
                st.sampled_from(
                    [
                        "exact",
                        "exact",
                        "reversed",
                        "extra",
                        "missing",
                        "bad-key",
                        "malformed",
                        "uncertain",
                        "no-evidence",
                        "bogus",
                    ]
                )
            )
            if variant in ("exact", "reversed", "extra", "missing", "bad-key", "malformed"):
                given["certainty"] = "confirmed"
                settled = {k: list(v) for k, v in required.items()}
                if variant == "reversed":
                    settled = {k: v[::-1] for k, v in reversed(list(settled.items()))}
                elif variant == "extra":
                    settled["tools"] = [*settled["tools"], "invocation-9-9"]
                elif variant == "missing":
                    nonempty = [k for k, v in settled.items() if v]
                    if nonempty:
                        settled[nonempty[0]] = settled[nonempty[0]][1:]
                    else:
                        settled["dependencies"] = ["dep-z"]
                elif variant == "bad-key":
                    settled["resources"] = []
                elif variant == "malformed":
                    settled["tools"] = draw(
                        st.sampled_from([5, "ab", [1, "a"], [{"a": 1}, {"b": 2}]])
                    )
                given["settled"] = settled
            elif variant == "uncertain":
                given["certainty"] = "uncertain"
                given["evidence"] = draw(st.sampled_from([["lost"], {"why": "hung"}, "cut"]))
            elif variant == "no-evidence":
                given["certainty"] = "uncertain"
                given["evidence"] = draw(st.sampled_from([[], None, ""]))
            else:
                given["certainty"] = draw(st.sampled_from(["maybe", None]))
        # identity: mostly absent, sometimes stale or foreign
        identity = draw(st.sampled_from(["none"] * 12 + ["current", "older", "newer", "foreign"]))
        if identity == "current":
            given["incarnation"] = m.incarnation
            given["run_id"] = RUN
        elif identity == "older":
            given["incarnation"] = m.incarnation - 1
        elif identity == "newer":
            given["incarnation"] = m.incarnation + 1
        elif identity == "foreign":
            given["run_id"] = "run-2"
        return given

    # -- rules ---------------------------------------------------------------

    @rule(
        data=st.data(),
        kind=st.sampled_from([*KINDS, "bogus", "fence"]),
        advance=ADVANCE,
        skew=SKEW,
    )
    def any_command(self, data: st.DataObject, kind: str, advance: float, skew: float) -> None:
        """Any command, whatever the state."""
        self.run_command(data, kind, advance, skew)

    @rule(data=st.data(), advance=ADVANCE, skew=SKEW)
    def likely_command(self, data: st.DataObject, advance: float, skew: float) -> None:
        """A command the state plausibly allows, so runs get somewhere."""
        kind = data.draw(st.sampled_from(self.model.likely_kinds()))
        self.run_command(data, kind, advance, skew)

    def run_command(self, data: st.DataObject, kind: str, advance: float, skew: float) -> None:
        self.now += advance
        at = self.now + skew  # sometimes a time before the deadline, once past it
        given = self.draw_input(data, kind)
        expected = self.model.refusal(kind, given, at)
        before = self.record
        result, exc = outcome_of(lambda: transition(before, Command(kind, at, given)))
        if exc is not None:
            event(f"refused {kind}: {exc.error_class.value}")
            assert expected is not None, f"refused {kind} {given}: {exc!r}"
            assert exc.error_class is expected, f"{kind} {given}: {exc!r}, model says {expected}"
            assert self.record is before
            if expected is V and kind in KINDS and (self.model.state in TERMINAL):
                assert exc.message == "command is invalid in the current run state"
            if expected is T:
                assert exc.message == "run deadline has expired"
                assert exc.details["boundary"] == "before_store"
            return
        assert expected is None, f"accepted {kind} {given}; model says {expected}"
        new, events = result
        event(f"accepted {kind} -> {new.state}")
        self.model.accept(kind, given, at)
        assert new.revision == before.revision + 1
        assert [e.type for e in events] == [f"run.{kind}"]
        assert events[0].occurred_at == at
        assert events[0].payload["state"] == new.state
        self.record = new

    @rule(delta=st.integers(-1, 2))
    def fence_incarnation(self, delta: int) -> None:
        incarnation = self.model.incarnation + delta
        if delta <= 0:
            _, exc = outcome_of(lambda: fence(self.record, incarnation))
            assert exc is not None, "fence accepted a non-increasing incarnation"
            assert exc.error_class is C
            return
        self.record, events = fence(self.record, incarnation)
        self.model.incarnation = incarnation
        self.model.revision += 1
        assert [e.type for e in events] == ["run.fence"]

    @precondition(lambda self: self.model.state == "running" and self.model.provider is None)
    @rule()
    def complete_a_tool(self) -> None:
        """Steer towards settled work so finishes and cleanups get exercised."""
        if self.model.tools:
            invocation = sorted(self.model.tools)[0]
            given = {"invocation_id": invocation}
            if self.model.deadline is None or self.now <= self.model.deadline:
                self.record, _ = transition(self.record, Command("tool_completed", self.now, given))
                self.model.accept("tool_completed", given, self.now)

    # -- invariants ----------------------------------------------------------

    @invariant()
    def matches_the_model(self) -> None:
        r, m = self.record, self.model
        assert r.revision == m.revision
        assert r.incarnation == m.incarnation
        assert r.state == m.state
        assert r.admitted == m.admitted
        assert r.deadline == m.deadline
        assert (r.active_provider or {}).get("attempt_id") == m.provider
        assert r.step_id == m.step
        assert set(r.active_tools) == m.tools
        assert set(r.tool_results) == m.done_tools
        assert (
            None
            if r.active_wait is None
            else (r.active_wait["wait_id"], r.active_wait["dependency"])
        ) == m.wait
        assert list(r.dependencies) == m.dependencies
        assert {k: v["status"] for k, v in r.intents.items()} == m.intents
        assert r.stop_reason == m.stop_reason
        if m.cleanup_required is not None:
            assert thaw(r.cleanup_required) == m.cleanup_required

    @invariant()
    def budget_is_consistent(self) -> None:
        budget = self.record.budget
        assert budget.quota == self.model.quota
        assert budget.used <= budget.quota
        assert budget.used == len(budget.reservations) == sum(budget.reservations.values())
        assert set(budget.reservations) == set(self.record.intents)

    @invariant()
    def intents_are_well_formed(self) -> None:
        r = self.record
        for key, intent in r.intents.items():
            assert intent["status"] in INTENT_STATUSES
            kind, _, ident = key.partition(":")
            assert intent["kind"] == kind
            assert ident == intent["attempt_id" if kind == "provider" else "invocation_id"]
        for invocation in r.active_tools:
            assert r.intents[f"tool:{invocation}"]["status"] in ("started", "uncertain")
        if r.active_provider is not None:
            key = f"provider:{r.active_provider['attempt_id']}"
            assert r.intents[key]["status"] in ("started", "uncertain")

    @invariant()
    def terminal_work_is_settled(self) -> None:
        r = self.record
        if r.state in ("cancelled", "timed_out", "completed", "failed"):
            assert r.active_provider is None
            assert not r.active_tools
            assert r.active_wait is None
            assert "started" not in {i["status"] for i in r.intents.values()}
        if r.state in TERMINAL:
            assert r.outcome is not None
            assert r.outcome["status"] == r.state
        else:
            assert "uncertain" not in {i["status"] for i in r.intents.values()}
        if r.state == "waiting_result":
            assert r.active_wait is not None


KernelMachine.TestCase.settings = settings(
    settings.default,
    max_examples=max(settings.default.max_examples, 150),
    stateful_step_count=30,
    deadline=None,
)
TestKernelStateMachine = KernelMachine.TestCase
