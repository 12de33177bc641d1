"""pytest 插件：把每个测试的结果和一行原因写成 JSON，python -m tools.run_tests 据此按任务打进度表。

    pytest ... -p tests.harness.progress   # 环境变量 MINISGL_PROGRESS 指定输出文件
"""

from __future__ import annotations

import ast
import json
import os
import re
import textwrap

import pytest

_RESULTS: dict[str, dict] = {}
# 一行原因按优先级找：桩的 NotImplementedError（可能在子进程的 stderr 里）、对齐报告的第一次分叉、断言的第一行
_REASONS = [re.compile(r"NotImplementedError: .*"), re.compile(r"提示词 .*第一次分叉")]


def one_line_reason(report) -> str:
    """进度表里的一行原因：桩、对齐报告、没抛的异常、没对上的 match=、失败的断言本身（不是它附带的输出）。"""
    text = str(report.longrepr or "")
    for pattern in _REASONS:
        hits = pattern.findall(text)
        if hits:
            return re.split(r"\\n|['\"]\s*[=,)]", hits[-1])[0].strip()  # 子进程输出的 repr 里换行是 \\n
    crash = getattr(report.longrepr, "reprcrash", None)
    msg = crash.message if crash is not None else text.strip().splitlines()[-1] if text.strip() else ""
    first = msg.strip().splitlines()[0] if msg.strip() else ""
    if first.startswith("Failed: DID NOT RAISE"):
        return first.removeprefix("Failed: ")
    if "Regex pattern did not match" in msg:
        want = re.search(r"(?:Expected )?[Rr]egex: (.*)", msg)
        got = re.search(r"(?:Actual message|Input): (.*)", msg)
        return f"match= 没对上：要 {want.group(1) if want else '?'}，实际是 {got.group(1) if got else '?'}"
    if first.startswith("AssertionError") or first.startswith("assert "):
        stmt = _failed_assert(report)
        if stmt:
            why = [line for line in msg.splitlines() if line.startswith("assert ")]
            short = why and len(why[-1]) <= 60 and why[-1] != stmt  # 长的展开多半是整段输出，不要
            return stmt + (f"（{why[-1]}）" if short else "")
    return first


def _failed_assert(report) -> str:
    """失败的那条 assert 语句（只要条件，不要它附带的消息：消息常常是子进程的整段 stderr）。"""
    entries = getattr(getattr(report.longrepr, "reprtraceback", None), "reprentries", None) or []
    lines = getattr(entries[-1], "lines", []) if entries else []
    start = next((i for i, line in enumerate(lines) if line.startswith(">")), None)
    if start is None:
        return ""
    body = [lines[start][1:]] + [line for line in lines[start + 1:] if not line.startswith("E")][:8]
    for n in range(len(body), 0, -1):  # 多行的 assert：取能解析的最长前缀
        try:
            node = ast.parse(textwrap.dedent("\n".join(body[:n])).strip()).body[0]
        except (SyntaxError, IndexError):
            continue
        if isinstance(node, ast.Assert):
            return f"assert {ast.unparse(node.test)}"
        return ""
    return ""


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
