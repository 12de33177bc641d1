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
    # --tb=long 用 ">" 标出失败的那一行；--tb=short（run_tests 用的）没有标记，失败的语句就是 "E" 行之前的那几行
    start = next((i for i, line in enumerate(lines) if line.startswith(">")), None)
    if start is None:
        first_e = next((i for i, line in enumerate(lines) if line.startswith("E")), len(lines))
        body = [line for line in lines[:first_e] if line.strip() and set(line.strip()) != {"^"}][-8:]
    else:
        body = [lines[start][1:]] + [line for line in lines[start + 1:]
                                     if not line.startswith("E") and set(line.strip()) != {"^"}][:8]
    for i in range(len(body)):  # 多行的 assert：找一段能解析成 assert 的连续行
        for n in range(len(body), i, -1):
            try:
                node = ast.parse(textwrap.dedent("\n".join(body[i:n])).strip()).body[0]
            except (SyntaxError, IndexError):
                continue
            if isinstance(node, ast.Assert):
                return f"assert {ast.unparse(node.test)}"
    asserts = [line.strip() for line in body if line.strip().startswith("assert")]
    return f"{asserts[-1]} …" if asserts else ""  # --tb=short 只给多行 assert 的第一行


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


@pytest.hookimpl(tryfirst=True)  # 在 -k / -m 挑选之前：记下收集到的全部测试，再按 MINISGL_SELECT / MINISGL_TASK 挑
def pytest_collection_modifyitems(config, items):
    _COLLECTED[:] = [item.nodeid for item in items]
    _select(config, items)


def _select(config, items):
    """python -m tools.run_tests 分几个进程跑一章：MINISGL_SELECT=own（本章的任务）、regress（前面各章的测试）、
    real（真权重一档）；MINISGL_TASK=K 只留本章任务 K 的测试。MINISGL_CHAPTER 是按哪一章归类。"""
    select, task = os.environ.get("MINISGL_SELECT"), os.environ.get("MINISGL_TASK")
    if not select and not task:
        return
    from tools.task_table import chapter_of_test, load_tasks, task_of_test

    chapter, all_tasks = int(os.environ.get("MINISGL_CHAPTER", "0")), load_tasks()

    def keep(nodeid: str) -> bool:
        real = nodeid.startswith("tests/real/")
        own = chapter_of_test(nodeid, chapter) == chapter
        if select == "own" and (real or not own) or select == "regress" and (real or own) \
                or select == "real" and not real:
            return False
        if task:
            t = task_of_test(all_tasks, nodeid, chapter)
            return own and t is not None and str(t.number) == task
        return True

    kept = [item for item in items if keep(item.nodeid)]
    dropped = [item for item in items if not keep(item.nodeid)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


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
