"""浏览器测试共用的：Debian 的 chromium（playwright 只驱动它，从不下载浏览器）、启动参数、缺了怎么办。"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def unavailable(missing: str, install: str) -> None:
    """CI 里缺浏览器是环境坏了，要失败；本地缺浏览器只跳过，并告诉读者怎么装。"""
    if os.environ.get("CI"):
        pytest.fail(f"CI 环境里{missing}：浏览器测试不能跳过，.ci/run 应该先装好（{install}）", pytrace=False)
    pytest.skip(f"{missing}，跳过浏览器测试；安装：{install}")
