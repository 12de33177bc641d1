"""仓库级测试共用的浏览器 fixture：书（test_site.py）和 trace 的网页（test_trace_browser.py）都用它。"""

from __future__ import annotations

import pytest

from tests.harness.browser import CHROMIUM, LAUNCH_ARGS, unavailable


@pytest.fixture(scope="module")
def playwright():
    if not CHROMIUM.exists():
        unavailable(f"没有 {CHROMIUM}", "sudo apt-get install -y chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("没有装 playwright", "pip install -r requirements.txt")
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright):
    b = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
    yield b
    b.close()
