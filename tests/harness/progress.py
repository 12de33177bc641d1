"""pytest 插件：把每个测试的结果和一行原因写成 JSON，python -m tools.run_tests 据此按任务打进度表。

    pytest ... -p tests.harness.progress   # 环境变量 MINISGL_PROGRESS 指定输出文件

一行原因取自失败的那个异常本身，不从打印出来的回溯里切：
- 查报错的测试都经过 tests/harness/errors.py，它失败时的消息就是一行（"期望 ValueError（match=…），得到 KeyError: …"）；
- 碰到桩时是桩的 NotImplementedError（在子进程里碰到的，消息里带着它的原话，也认得出来）；
- 别的失败是异常消息的第一行：assert 的说明（pytest 改写过的 "assert 3 == 2"，或测试自己给的消息）、对齐报告的第一行。
"""

from __future__ import annotations

import json
import os
import re

import pytest

_RESULTS: dict[str, dict] = {}
_SECONDS: dict[str, float] = {}  # node id -> 三个阶段的秒数之和（python -m tools.suite.profile 的最慢测试表用）
_REASONS: dict[str, str] = {}  # node id -> 这次失败的一行原因（makereport 时从异常取）
_STUB = re.compile(r"NotImplementedError: 第 \d+ 章 · 任务 \d+：[^\n'\"\\]*")


def reason_of(exc: BaseException) -> str:
    """失败的异常 -> 进度表里的一行原因。"""
    if isinstance(exc, NotImplementedError):
        return f"NotImplementedError: {exc}".splitlines()[0]
    text = str(exc)
    stub = _STUB.search(text)  # 子进程碰到了桩：它的 stderr 在消息里
    if stub:
        return stub.group(0).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    first = lines[0].strip() if lines else ""
    if isinstance(exc, AssertionError):
        return _assert_reason(lines) or "assert 失败"
    name = type(exc).__name__
    if name == "Failed":  # pytest.fail(...)：消息本身就是原因
        return first
    return f"{name}: {first}" if first else name


def _assert_reason(lines: list[str]) -> str:
    """pytest 改写过的 assert 的消息是"测试给的消息 + 换行 + assert 的说明"。测试给的消息第一行是一句话（比如对齐报告的
    "第一次分叉"）就用它；是整段子进程输出（Traceback、警告）时用说明那一行（"assert 1 == 0"）。"""
    at = max((i for i, line in enumerate(lines) if line.startswith("assert ")), default=None)
    message = lines[:at] if at is not None else lines
    if message and not re.match(r"\s*(Traceback|File \"|\S+:\d+: \w*Warning)", message[0]):
        return message[0].strip()
    return lines[at].strip() if at is not None else (message[0].strip() if message else "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        _REASONS[report.nodeid] = reason_of(call.excinfo.value)


def pytest_runtest_logreport(report):
    prev = _RESULTS.get(report.nodeid)
    if report.failed:
        if prev is None or prev["outcome"] != "failed":
            reason = _REASONS.get(report.nodeid)
            if reason is None:  # 没有异常对象可看（比如插件报的失败）：取报告的最后一行
                lines = str(report.longrepr or "").strip().splitlines()
                reason = lines[-1] if lines else ""
            _RESULTS[report.nodeid] = {"outcome": "failed", "reason": reason}
    elif report.skipped and prev is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        _RESULTS[report.nodeid] = {"outcome": "skipped", "reason": str(reason)}
    elif report.when == "call" and prev is None:
        _RESULTS[report.nodeid] = {"outcome": "passed", "reason": ""}
    _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration  # setup + call + teardown


_COLLECTED: list[str] = []


@pytest.hookimpl(tryfirst=True)  # 在 -k / -m 挑选之前：记下收集到的全部测试，再按 MINISGL_SELECT / MINISGL_TASK 挑
def pytest_collection_modifyitems(config, items):
    _COLLECTED[:] = [item.nodeid for item in items]
    _select(config, items)


def _select(config, items):
    """python -m tools.run_tests 分几个进程跑一章：MINISGL_SELECT=own（本章的任务）、given（本章给定代码自己的测试，
    tests/tasks.toml 的 given_tests）、regress（前面各章的测试）、real（真权重一档），几种可以用逗号连起来
    （given,regress）；MINISGL_TASK=K 只留本章任务 K 的测试（不含给定代码的测试）。MINISGL_CHAPTER 是按哪一章归类。"""
    select, task = os.environ.get("MINISGL_SELECT"), os.environ.get("MINISGL_TASK")
    if not select and not task:
        return
    select_items(config, items, select, task, int(os.environ.get("MINISGL_CHAPTER", "0")))


def select_items(config, items, select: str | None, task: str | None, chapter: int) -> None:
    """按 select（own / given / regress / real）和任务号 task 挑测试，其余的报成 deselected。
    pytest 的 --task K（tests/conftest.py）也走这里：和 check --task K 挑出同一份。"""
    from tools.manifest import is_given_test
    from tools.workbench.task_table import chapter_of_test, load_tasks, task_of_test

    all_tasks = load_tasks()

    def keep(nodeid: str) -> bool:
        real = nodeid.startswith("tests/real/")
        own = chapter_of_test(nodeid, chapter) == chapter
        given = own and not real and is_given_test(chapter, nodeid)
        wanted = {"own": own and not real and not given, "given": given, "regress": not own and not real,
                  "real": real}
        if select and not any(wanted.get(s, False) for s in select.split(",")):
            return False
        if task:
            t = task_of_test(all_tasks, nodeid, chapter)
            return own and not given and t is not None and str(t.number) == task
        return True

    kept = [item for item in items if keep(item.nodeid)]
    dropped = [item for item in items if not keep(item.nodeid)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collectreport(report):
    if report.failed:
        text = str(report.longrepr or "").strip().splitlines()
        error = next((line for line in reversed(text) if line.startswith("E ")), text[-1] if text else "")
        _RESULTS[report.nodeid or "<收集>"] = {"outcome": "error", "reason": error.removeprefix("E").strip()}


def pytest_sessionfinish(session):
    path = os.environ.get("MINISGL_PROGRESS")
    if path and not hasattr(session.config, "workerinput"):  # pytest-xdist 的 worker 不写：结果都转给了主进程
        for nodeid, entry in _RESULTS.items():
            entry["seconds"] = round(_SECONDS.get(nodeid, 0.0), 3)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_RESULTS, f, ensure_ascii=False)
        with open(path + ".collected", "w", encoding="utf-8") as f:
            json.dump(_COLLECTED, f)
