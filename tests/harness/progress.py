"""pytest 插件：把每个测试的结果和一行原因写成 JSON，python -m tools.run_tests 据此按任务打进度表。

    pytest ... -p tests.harness.progress   # 环境变量 MINISGL_PROGRESS 指定输出文件
"""

from __future__ import annotations

import json
import os
import re

import pytest

_RESULTS: dict[str, dict] = {}
# 一行原因按优先级找：桩的 NotImplementedError（可能在子进程的 stderr 里）、对齐报告的第一次分叉、断言的第一行
_REASONS = [re.compile(r"NotImplementedError: .*"), re.compile(r"提示词 .*第一次分叉")]


def one_line_reason(report) -> str:
    text = str(report.longrepr or "")
    for pattern in _REASONS:
        hits = pattern.findall(text)
        if hits:
            return re.split(r"\\n|['\"]\s*[=,)]", hits[-1])[0].strip()  # 子进程输出的 repr 里换行是 \\n
    crash = getattr(report.longrepr, "reprcrash", None)
    msg = crash.message if crash is not None else text.strip().splitlines()[-1] if text.strip() else ""
    return msg.strip().splitlines()[0] if msg.strip() else ""


def pytest_runtest_logreport(report):
    prev = _RESULTS.get(report.nodeid)
    if report.failed:
        if prev is None or prev["outcome"] != "failed":
            _RESULTS[report.nodeid] = {"outcome": "failed", "reason": one_line_reason(report)}
    elif report.skipped and prev is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        _RESULTS[report.nodeid] = {"outcome": "skipped", "reason": str(reason)}
    elif report.when == "call" and prev is None:
        _RESULTS[report.nodeid] = {"outcome": "passed", "reason": ""}


_COLLECTED: list[str] = []


@pytest.hookimpl(tryfirst=True)  # 在 -k / -m 挑选之前：记下收集到的全部测试
def pytest_collection_modifyitems(items):
    _COLLECTED[:] = [item.nodeid for item in items]


def pytest_collectreport(report):
    if report.failed:
        _RESULTS[report.nodeid or "<收集>"] = {"outcome": "error", "reason": one_line_reason(report)}


def pytest_sessionfinish(session):
    path = os.environ.get("MINISGL_PROGRESS")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_RESULTS, f, ensure_ascii=False)
        with open(path + ".collected", "w", encoding="utf-8") as f:
            json.dump(_COLLECTED, f)
