"""tests/tasks.toml 的测试模式都有用，进度表上每个任务只数它自己的测试。

- 每个模式（tests、given_tests）至少匹配这一章收集得到的一个测试：写错的文件名、改了名的测试不会悄悄留在清单里；
- 真权重一档（tests/real/）在清单里归某个任务（--task K --real 才跑得到它），进度表上却单独一行：
  任务各行加起来就是"本章的任务"那一份跑的个数。

测试的 node id 从源文件里读（ast），按 tests/conftest.py 的规则挑出一章收集得到的：tests/chN/、tests/checkpoint/、
tests/real/（test_chM_real.py 从第 M 章起）。
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import re
from pathlib import Path

import pytest

from tools.manifest import given_test_patterns, load_tasks

ROOT = Path(__file__).resolve().parents[2]


def _tests_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(ROOT).as_posix()
    return [f"{rel}::{n.name}" for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")]


def collected(chapter: int) -> list[str]:
    """第 chapter 章归自己的任务的测试（不含参数）：本章目录、命令行契约、真权重一档。"""
    files = sorted((ROOT / "tests" / f"ch{chapter}").glob("test_*.py")) if chapter else []
    files += sorted((ROOT / "tests" / "checkpoint").glob("test_*.py"))
    for p in sorted((ROOT / "tests" / "real").glob("test_*.py")):
        m = re.match(r"test_ch(\d+)_", p.name)
        if m is None or int(m.group(1)) <= chapter:
            files.append(p)
    return [nodeid for f in files for nodeid in _tests_in(f)]


def unmatched(chapter: int) -> list[str]:
    names = collected(chapter)
    patterns = [(f"任务 {t.number}", p) for t in load_tasks()[chapter] for p in t.tests]
    patterns += [("given_tests", p) for p in given_test_patterns(chapter)]
    return [f"第 {chapter} 章 {who}：{p}" for who, p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]


@pytest.mark.parametrize("chapter", sorted(load_tasks()))
def test_every_pattern_matches_a_test(chapter):
    bad = unmatched(chapter)
    assert not bad, "tests/tasks.toml 里这些模式一个测试也匹配不到（文件名写错了？测试改名了？）：\n" + "\n".join(bad)


def test_a_stale_pattern_is_caught(monkeypatch):
    """自检：指向不存在的文件的模式要报出来。"""
    tasks = {k: list(v) for k, v in load_tasks().items()}
    tasks[2][1] = dataclasses.replace(tasks[2][1], tests=[*tasks[2][1].tests, "tests/ch2/test_nowhere.py::*"])
    monkeypatch.setitem(globals(), "load_tasks", lambda: tasks)
    assert unmatched(2) == ["第 2 章 任务 2：tests/ch2/test_nowhere.py::*"]


def test_task_rows_add_up_and_the_real_tier_is_its_own_row():
    """真权重一档的测试不算进它在清单里归的任务：任务各行的个数加起来等于本章的任务跑的个数。"""
    from tools.workbench.task_table import progress_table, task_of_test

    own = [n for n in collected(3) if not n.startswith("tests/real/")]
    real = [n for n in collected(3) if n.startswith("tests/real/")]
    assert own and real and all(task_of_test(load_tasks(), n, 3) is not None for n in real)
    results = {n: {"outcome": "passed", "reason": ""} for n in own + real}
    table, ok = progress_table(results, 3)
    rows = table.splitlines()[1:]
    counts = [int(m.group(1)) for r in rows if (m := re.match(r"[✓✗] 任务 \d+ · .*? \d+/(\d+)", r))]
    assert len(counts) == len(load_tasks()[3]), table
    assert ok and sum(counts) == len(own), table
    real_rows = [r for r in rows if "真权重一档" in r]
    assert len(real_rows) == 1 and f"{len(real)}/{len(real)}" in real_rows[0], table
