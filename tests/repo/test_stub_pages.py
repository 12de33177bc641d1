"""桩跟着页面走（python course.py start 写出的桩 = 页面上各任务点了名的符号）：

- tests/tasks.toml 没有兜底的符号模式 "*"：桩只来自任务点了名的文件和符号；
- 给定的文件（tasks.toml 的 given）整份复制、一个桩也没有，页面的「任务」一节写着它们；
- 第 6 章每个桩的名字都写在它那个任务的正文里（第 1~5 章的任务一节还没有逐个写到私有的小函数，见报告）；
- 第 6 章每个有桩的任务：只把这一个任务写成桩、其余放参考文件，这个任务的第一个测试失败，原因写着这个任务。
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.manifest import load_manifest
from tools.manifest import load_tasks
from tools import stubs, workspace
from tools.manifest import given_patterns, is_given

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = load_manifest()
CH6 = next(c for c in CHECKPOINTS if c.chapter == 6)


def _page(chapter: int) -> str:
    return (ROOT / "docs" / ("step0.md" if chapter == 0 else f"ch{chapter}.md")).read_text(encoding="utf-8")


def _task_section(chapter: int) -> str:
    m = re.search(r"^## 任务\n(.*?)(?=^## |\Z)", _page(chapter), re.M | re.S)
    assert m, f"第 {chapter} 章的页面没有「任务」一节"
    return m.group(1)


def _task_texts(chapter: int) -> dict[int, str]:
    """任务号 -> 这个任务的小标题和正文（到下一个三级标题为止）。"""
    return {int(m.group(1)): m.group(0)
            for m in re.finditer(r"^### 任务 (\d+) · .*?(?=^### |\Z)", _task_section(chapter), re.M | re.S)}


def _name(qualname: str) -> str:
    """页面上该写出的名字：方法写方法名；__init__、__post_init__ 写类名。"""
    parts = qualname.split(".")
    return parts[-2] if parts[-1] in ("__init__", "__post_init__") else parts[-1]


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) is not None


def unnamed_stubs(ck, texts: dict[int, str]) -> list[str]:
    return [f"{s.key}（任务 {s.task.number if s.task else '?'}）" for s in stubs.find_stubs(ck)
            if s.task is None or not _mentions(texts.get(s.task.number, ""), _name(s.qualname))]


def test_tasks_toml_has_no_catch_all_symbol():
    for chapter, tasks in load_tasks().items():
        for t in tasks:
            assert "*" not in t.symbols, f"{t.label} 的 symbols 有兜底的 \"*\"：写出具体的文件和符号"


@pytest.mark.parametrize("ck", CHECKPOINTS, ids=lambda c: c.name)
def test_given_files_hold_no_stub_and_are_on_the_page(ck, tmp_path):
    given = [rel for rel in stubs.changes(ck) if is_given(ck.chapter, rel)]
    assert not [s.key for s in stubs.find_stubs(ck) if is_given(ck.chapter, s.file)]
    section = _task_section(ck.chapter)
    for pattern in given_patterns(ck.chapter):
        assert any(is_given(ck.chapter, rel) for rel in stubs.changes(ck)), f"given 的 {pattern} 一个文件也没选到"
        named = pattern.rstrip("*")
        assert f"`{named}`" in section, \
            f"第 {ck.chapter} 章页面的「任务」一节要写出给定的 `{named}`（做什么、书里哪里讲）"
    if not given:
        return
    ws = tmp_path / "ws"
    workspace.make_workspace(ck, ws)
    for rel in given:
        if (ck.path / rel).exists():
            assert (ws / rel).read_bytes() == (ck.path / rel).read_bytes(), f"给定的 {rel} 没有整份复制"
            assert b"NotImplementedError(" not in (ws / rel).read_bytes() or \
                b"NotImplementedError(" in (ck.path / rel).read_bytes(), f"给定的 {rel} 里有桩"


def test_chapter6_every_stub_is_named_in_its_task():
    missing = unnamed_stubs(CH6, _task_texts(6))
    assert not missing, "docs/ch6.md 的任务正文没写到这些桩：\n" + "\n".join(missing)


def test_the_page_check_catches_a_missing_name():
    """自检：把任务 2 的正文里的 check_batch 去掉，上面的检查必须报出它。"""
    texts = _task_texts(6)
    assert "minisgl/engine/engine.py:Engine.check_batch（任务 2）" not in unnamed_stubs(CH6, texts)
    texts[2] = texts[2].replace("check_batch", "check_it")
    assert "minisgl/engine/engine.py:Engine.check_batch（任务 2）" in unnamed_stubs(CH6, texts)


def _first_test_of(task: int) -> tuple[str, str]:
    for f in sorted((ROOT / "tests" / "ch6").glob("test_*.py")):
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith(f"test_task{task}_"):
                return f.relative_to(ROOT).as_posix(), node.name
    raise AssertionError(f"第 6 章任务 {task} 没有 test_task{task}_ 测试")


STUBBED_TASKS = sorted({s.task.number for s in stubs.find_stubs(CH6) if s.task})


@pytest.mark.parametrize("task", STUBBED_TASKS, ids=lambda n: f"task{n}")
def test_chapter6_each_task_alone_fails_with_its_name(task, tmp_path):
    """参考目录里只有这一个任务是桩：它的第一个测试失败，原因是写着这个任务号的 NotImplementedError。"""
    ws = tmp_path / "my_ch6"
    made = workspace.make_workspace(CH6, ws)
    for rel in {s.file for s in made}:  # 别的任务放回参考代码，只留这个任务的桩
        mine = [s for s in made if s.file == rel and s.task.number == task]
        src = (CH6.path / rel).read_text(encoding="utf-8")
        (ws / rel).write_text(stubs.stub_source(src, mine, "ch5_attention"), encoding="utf-8")
    probe_file, name = _first_test_of(task)
    out = tmp_path / "progress.json"
    env = dict(os.environ, MINISGL_PROGRESS=str(out), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "pytest", probe_file, "-q", "-x", "-p", "no:cacheprovider",
                          "-p", "tests.harness.progress", "--checkpoint", str(ws), "--as", "ch6", "-k", name],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    results = json.loads(out.read_text()) if out.exists() else {}
    ran = {k: v for k, v in results.items() if k.startswith(f"{probe_file}::{name}")}
    assert ran, res.stdout[-3000:] + res.stderr[-2000:]
    failed = [v for v in ran.values() if v["outcome"] == "failed"]
    assert failed, f"只有任务 {task} 是桩时 {name} 没有失败"
    assert all(v["reason"].startswith(f"NotImplementedError: 第 6 章 · 任务 {task}：") for v in failed), \
        [v["reason"] for v in failed]
