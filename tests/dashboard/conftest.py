"""The dashboard in a real browser: Debian's chromium driven by Playwright, against
the real server (uvicorn in a subprocess) on every backend. One browser per test module."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.server.conftest import APP, Server, producer, start_server  # noqa: F401  (fixtures)

CHROMIUM = os.environ.get("CONVEYOR_TEST_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    # Module scope: Playwright's sync API runs an event loop in this thread while it
    # is open, and later tests call asyncio.run(); it must be closed before them.
    sync_api = pytest.importorskip("playwright.sync_api")
    if not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM):
        pytest.fail(
            f"the dashboard tests need Chromium at {CHROMIUM} (apt-get install chromium, or set "
            "CONVEYOR_TEST_CHROMIUM); .ci/run installs it"
        )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser):
    """A fresh browser context (no cookies) and page; console errors are collected
    in ``page.errors`` and requests to any other origin in ``page.outside``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.errors = []
    pg.outside = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("dialog", lambda d: d.accept())
    yield pg
    context.close()


@pytest.fixture
def server(start_server) -> Server:  # noqa: F811
    return start_server("--app", APP)
