"""Headless Chromium (Debian's chromium and chromium-driver) driven by
Selenium, each blocking call in a worker thread so the test's
conversations go on meanwhile."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import trio

from tests.prerequisites import unavailable

T = TypeVar("T")

#: Chromium's own network traffic is refused by this machine's closed
#: network: the flags keep it from trying (and from slowing every start).
_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--window-size=1280,900",
)


@contextmanager
def chromium() -> Iterator[Any]:
    """A Selenium WebDriver on headless Chromium; skipped (failed in CI)
    without the browser, its driver or selenium."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        unavailable("chromium and chromedriver not found", tests="console browser")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ModuleNotFoundError:
        unavailable("selenium is not installed", tests="console browser")
    with tempfile.TemporaryDirectory(prefix="backplane-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in (*_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        browser = webdriver.Chrome(options=options, service=Service(executable_path=driver))
        try:
            yield browser
        finally:
            browser.quit()


async def call(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` in a worker thread."""
    return await trio.to_thread.run_sync(function, *args)


async def until(check: Callable[[], Any], *, seconds: float = 30.0) -> Any:
    """Poll ``check`` (in a thread) until it returns something true."""
    with trio.fail_after(seconds):
        while True:
            found = await call(check)
            if found:
                return found
            await trio.sleep(0.05)
