"""The Code Mode worker with the real Deno binary: values, output, and a
sandbox that refuses everything a cell might reach for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from tests.conftest import LINUX_ONLY
from trio_backplane import Error, ErrorClass
from trio_backplane.codemode import CodeWorker
from trio_backplane.resources._proc import group_members

pytestmark = LINUX_ONLY


async def test_a_cell_returns_json_and_its_output() -> None:
    async with CodeWorker() as worker:
        result = await worker.run('console.log("hi", {a: 1}); return {sum: 1 + 2, xs: [1, 2]}')
        assert (result.ok, result.value, result.output) == (
            True,
            {"sum": 3, "xs": [1, 2]},
            ('hi {"a":1}',),
        )
        nothing = await worker.run("const x = 1;")
        assert (nothing.ok, nothing.value) == (True, None)
        thrown = await worker.run('throw new RangeError("too far")')
        assert (thrown.ok, thrown.error, thrown.message) == (False, "RangeError", "too far")
        pgid = worker.pgid
        assert pgid is not None
    assert worker.cleanup_error is None
    assert group_members(pgid) == []


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ('return Deno.readTextFileSync("/etc/hostname")', "NotCapable"),
        ('Deno.writeTextFileSync("/tmp/codemode-canary", "x")', "NotCapable"),
        ('return Deno.env.get("HOME")', "NotCapable"),
        ("return Deno.env.toObject()", "NotCapable"),
        ('return (await fetch("https://example.com/")).status', "NotCapable"),
        ('const c = await Deno.connect({hostname: "127.0.0.1", port: 9}); return 1', "NotCapable"),
        (
            'return (await new Deno.Command("sh", {args: ["-c", "true"]}).output()).code',
            "NotCapable",
        ),
        ('return Deno.dlopen("libc.so.6", {})', "NotCapable"),
        ('return await import("https://example.com/x.js")', "TypeError"),
        ("Deno.exit(3)", "Error"),
    ],
    ids=["read", "write", "env", "env-all", "fetch", "socket", "spawn", "ffi", "remote", "exit"],
)
async def test_the_sandbox_refuses_with_a_classed_error(code: str, error: str) -> None:
    """Files, environment, network, processes, FFI, remote imports and
    exiting are refused inside the cell (a thrown error the model can read);
    the worker goes on and the host is untouched."""
    async with CodeWorker() as worker:
        result = await worker.run(code)
        assert (result.ok, result.error) == (False, error), result
        assert (await worker.run("return 7")).value == 7  # still serving
    assert not Path("/tmp/codemode-canary").exists()


async def test_an_endless_loop_is_cut_and_its_worker_stopped() -> None:
    async with CodeWorker() as worker:
        pgid = worker.pgid
        assert pgid is not None
        with pytest.raises(Error) as exc:
            await worker.run("while (true) {}", timeout=1.0)
        assert exc.value.error_class is ErrorClass.TIMEOUT
        assert group_members(pgid) == []
        with pytest.raises(Error) as exc:
            await worker.run("return 1")
        assert exc.value.error_class is ErrorClass.RESOURCE_CONFLICT


async def test_exhausting_memory_ends_the_worker_with_a_classed_error() -> None:
    async with CodeWorker(heap_mib=32) as worker:
        pgid = worker.pgid
        assert pgid is not None
        with pytest.raises(Error) as exc:
            await worker.run("const xs = []; while (true) { xs.push(new Array(1e6).fill(1)); }")
        assert exc.value.error_class is ErrorClass.EXECUTION_FAILURE
    with trio.fail_after(5):
        while group_members(pgid):
            await trio.sleep(0.01)


async def test_flooded_output_is_bounded() -> None:
    async with CodeWorker() as worker:
        result = await worker.run(
            'for (let i = 0; i < 1e5; i++) console.log("x".repeat(100)); return 1'
        )
    assert result.value == 1
    assert result.truncated is True
    assert sum(len(line) for line in result.output) <= 65536


def test_the_host_environment_is_not_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKPLANE_CANARY_SECRET", "canary-9")

    async def main() -> None:
        async with CodeWorker() as worker:
            result = await worker.run('return Deno.env.get("BACKPLANE_CANARY_SECRET")')
        assert (result.ok, result.error) == (False, "NotCapable")

    trio.run(main)
    assert os.environ["BACKPLANE_CANARY_SECRET"] == "canary-9"


async def test_tools_calls_reach_the_host_one_at_a_time() -> None:
    """``tools.<name>(args)`` awaits the host's answer; calls a cell makes
    together are answered one at a time, in order; an ``Error`` the host
    raises rejects the promise with its class and message, which the cell
    can catch."""
    from trio_backplane.errors import Error as HostError

    seen: list[tuple[str, object]] = []
    active = 0

    async def call(name: str, args: object) -> object:
        nonlocal active
        active += 1
        assert active == 1
        seen.append((name, args))
        await trio.sleep(0.01)
        active -= 1
        if name == "refuse":
            raise HostError(ErrorClass.VALIDATION, "arguments do not match the schema")
        return {"echo": args}

    code = """
        const one = await tools.lookup({q: 1});
        const many = await Promise.all([tools.lookup({q: 2}), tools.lookup({q: 3})]);
        let refused = null;
        try { await tools.refuse({}); } catch (e) { refused = [e.name, e.message]; }
        return {one, many, refused};
    """
    async with CodeWorker() as worker:
        result = await worker.run(code, call=call)
        bare = await worker.run("return await tools.anything({})")
    assert result.value == {
        "one": {"echo": {"q": 1}},
        "many": [{"echo": {"q": 2}}, {"echo": {"q": 3}}],
        "refused": ["validation", "arguments do not match the schema"],
    }
    assert seen == [
        ("lookup", {"q": 1}),
        ("lookup", {"q": 2}),
        ("lookup", {"q": 3}),
        ("refuse", {}),
    ]
    assert (bare.ok, bare.error) == (False, "unsupported_capability")
