"""书里"只跑任务 K"的命令挑出来的正是任务 K 的全部测试（tests/tasks.toml 的归类），不是名字里带 taskK 的那几个。

- 页面和 README 上没有 -k taskK：它只按名字挑，第 1 章任务 1 的 26 个测试只挑得到 8 个，读者会以为做完了；
- 每条带 --task K 的命令（course.py check、tools.run_tests、pytest）指向的那一章真有任务 K；
- pytest 的 --task K 和 check --task K（MINISGL_SELECT=own、MINISGL_TASK=K）挑出同一份，恰好是 tasks.toml 归给任务 K
  的本章测试，其中有名字里不带 taskK 的。
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tools.manifest import ROOT, by_name, is_given_test, load_tasks
from tools.workbench.task_table import chapter_of_test, task_of_test

PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md"))]
BY_NAME = re.compile(r"-k\s+[\"']?[^\"'\s]*task\d")
TASK_CMD = re.compile(r"python (?:course\.py check|-m tools\.run_tests|-m pytest tests)\b"
                      r"[^`#\n]*?--task\s+(\d+)[^`#\n]*")


def _task_commands() -> list[tuple[str, str, int]]:
    return [(page.name, m.group(0), int(m.group(1))) for page in PAGES
            for m in TASK_CMD.finditer(page.read_text(encoding="utf-8"))]


def _chapter(cmd: str) -> int:
    """按哪一章数任务：--as chN，否则 --checkpoint，否则 check / run_tests 后面的检查点。"""
    argv = cmd.split()
    opts = dict(zip(argv, argv[1:]))
    first = argv[3] if len(argv) > 3 and argv[2] in ("check", "tools.run_tests") else None
    spec = opts.get("--as") or opts.get("--checkpoint") or first
    ck = by_name(spec) if spec else None
    assert ck is not None, f"{cmd}：认不出是哪一章（--as chN、--checkpoint 或检查点名字）"
    return ck.chapter


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_selects_a_task_by_name(page):
    hits = [line.strip() for line in page.read_text(encoding="utf-8").splitlines()
            if BY_NAME.search(line) and "只按名字挑" not in line]
    assert not hits, f"{page.name}：-k taskK 只挑名字里带它的测试，不是任务的全部；用 --task K：{hits}"


def test_every_task_command_names_a_task_of_its_chapter():
    cmds = _task_commands()
    assert len({page for page, _, _ in cmds}) >= 6, cmds  # 每章都有
    tasks = load_tasks()
    for page, cmd, k in cmds:
        ch = _chapter(cmd)
        assert k in [t.number for t in tasks.get(ch, [])], f"{page}：{cmd}：第 {ch} 章没有任务 {k}"
        if "pytest" in cmd:
            assert "--checkpoint" in cmd, f"{page}：{cmd}：pytest 的 --task 要和 --checkpoint 一起用"


def _collect(ck: str, *args: str, **env: str) -> set[str]:
    res = subprocess.run([sys.executable, "-m", "pytest", "tests", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-p", "tests.harness.progress", "--checkpoint", ck, *args], cwd=ROOT,
                         env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return {line for line in res.stdout.splitlines() if "::" in line}


@pytest.mark.parametrize("ck,chapter,task", [("ch1", 1, 1), ("ch4", 4, 1)])
def test_task_option_selects_exactly_the_tasks_tests(ck, chapter, task):
    every = _collect(ck)
    tasks = load_tasks()
    want = {n for n in every if chapter_of_test(n, chapter) == chapter and not n.startswith("tests/real/")
            and not is_given_test(chapter, n) and getattr(task_of_test(tasks, n, chapter), "number", None) == task}
    by_pytest = _collect(ck, "--task", str(task))
    by_check = _collect(ck, MINISGL_CHAPTER=str(chapter), MINISGL_SELECT="own", MINISGL_TASK=str(task))
    assert by_pytest == want and by_check == want, (sorted(by_pytest ^ want)[:5], sorted(by_check ^ want)[:5])
    assert any(f"test_task{task}_" not in n for n in want), "这个例子要有名字里不带 taskK 的测试，才考得到 -k 的缺口"


def test_task_option_needs_a_checkpoint():
    res = subprocess.run([sys.executable, "-m", "pytest", "tests/repo/test_task_commands.py", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "--task", "1"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0 and "--checkpoint" in res.stdout + res.stderr, res.stdout[-1000:] + res.stderr[-1000:]

