"""Screenshots of the web console for the docs (``docs/images/``).

    python scripts/console_screenshots.py

Fills a SQLite store in a temporary directory with a few runs (completed,
failed, cancelled, and one waiting for an approval with its tool calls and
results), serves the console on a free loopback port, and takes the runs
page and the waiting run's page in headless Chromium (Debian's chromium and
chromium-driver, with Selenium: ``pip install -e '.[test]'``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.console.browser import call, chromium, until  # noqa: E402
from tests.console.support import Deploy, served, waiting_run  # noqa: E402
from trio_backplane import Authority, Error, ErrorClass, ToolRegistry, open_conversation  # noqa: E402
from trio_backplane.store import SQLiteStore  # noqa: E402
from trio_backplane.testing import ScriptedProvider as S  # noqa: E402
from trio_backplane.tools import ToolDescriptor, ToolResult  # noqa: E402

OUT = ROOT / "docs" / "images"


class Lookup:
    async def execute(self, operation: Any) -> ToolResult:
        await trio.sleep(0.05)
        return ToolResult(f"3 open incidents for {operation.arguments.get('service')}")


async def finished_run(store: Any, run_id: str, script: list[Any]) -> None:
    registry = ToolRegistry([ToolDescriptor("lookup_incidents", {"type": "object"}, Lookup())])
    async with open_conversation(
        run_id,
        store=store,
        provider=S(script),
        registry=registry,
        authority=Authority.for_registry(registry, caller="docs", run_id=run_id),
    ) as conversation:
        await conversation.prompt("how is checkout doing?")
        await conversation.wait_settled()


async def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        async with SQLiteStore(Path(scratch) / "runs.sqlite3") as store, served(store) as s:
            lookup = S.tool_calls(("c1", "lookup_incidents", {"service": "checkout"}))
            await finished_run(store, "triage-0412", [lookup, S.text("Three incidents open.")])
            overloaded = Error(ErrorClass.TRANSIENT_TRANSPORT, "provider answered HTTP 529")
            await finished_run(store, "triage-0413", [S.failure(overloaded)])
            await finished_run(store, "summary-0414", [S.text("All quiet.")])
            async with waiting_run(s, "deploy-0415", Deploy(), arguments={
                "service": "checkout", "version": "2.14.1", "region": "eu-west-1",
            }):  # fmt: skip
                with chromium() as browser:
                    await call(browser.get, s.login())
                    await until(lambda: "deploy-0415" in browser.page_source)
                    await call(browser.save_screenshot, str(OUT / "console-runs.png"))
                    await call(browser.get, f"{s.url}/runs/deploy-0415")
                    await until(lambda: "Approve" in browser.page_source)
                    await call(browser.set_window_size, 1280, 1500)
                    await call(browser.save_screenshot, str(OUT / "console-run.png"))
    print("written:", *(str(p.relative_to(ROOT)) for p in sorted(OUT.glob("console-*.png"))))


if __name__ == "__main__":
    trio.run(main)
