"""读者被告知的每条 python -m tools… 命令都还在：

- README.md 和 docs/ 里写的，从页面的文字里找出来（页面上新写一条，这里自动跟上），每个模块带 --help 真跑一遍
  （只解析命令行、什么也不做）；
- 代码里写给读者的（报错、提示、docstring、course.py --help、清单的注释），模块必须真有：工具搬家后，
  说给读者的命令跟着改。
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.procs import collect

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"python3? -m (tools(?:\.\w+)+)")
TIMEOUT = 120
NOT_TOOLS = {"tools.X", "tools.no_such_tool"}  # 说明里的占位符、test_docs.py 自检用的假名字


def _named(paths: list[Path]) -> dict[str, list[str]]:
    """模块 -> 写着它的文件。"""
    found: dict[str, list[str]] = {}
    for path in paths:
        for m in COMMAND.finditer(path.read_text(encoding="utf-8")):
            found.setdefault(m.group(1), []).append(str(path.relative_to(ROOT)))
    return found


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _sources() -> list[Path]:
    """说给读者的其余地方：工具、course.py、章节代码、测试（报错里的提示）、清单。"""
    files = [ROOT / "course.py", ROOT / "checkpoints.toml", ROOT / "tests" / "tasks.toml"]
    for folder in [ROOT / "tools", ROOT / "tests", *sorted(ROOT.glob("ch[0-9]_*")), *sorted(ROOT.glob("step0_*"))]:
        files += sorted(p for p in folder.rglob("*") if p.suffix in (".py", ".md", ".toml") and p.is_file()
                        and not {"__pycache__", "fixtures"} & set(p.relative_to(ROOT).parts))
    return files


def _exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


BOOK = _named(_pages())


def test_pages_name_tool_commands():
    """自检：正则真的找得到书里的命令（找不到时下面的测试什么也不查）。"""
    assert "tools.run_tests" in BOOK and "tools.models.make_tiny_models" in BOOK, sorted(BOOK)


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    """每个模块 --help 一次，同时起（两个核上串着跑要半分钟）。"""
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    procs = {m: subprocess.Popen([sys.executable, "-m", m, "--help"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace")
             for m in BOOK if _exists(m)}
    return collect(procs, timeout=TIMEOUT)


@pytest.mark.parametrize("module", sorted(BOOK))
def test_book_command_runs(module, helps):
    where = "、".join(sorted(set(BOOK[module])))
    assert _exists(module), f"{where} 写着 python -m {module}，但 tools/ 里没有这个模块"
    res = helps[module]
    assert res.returncode == 0 and "usage:" in res.stdout, \
        f"python -m {module} --help（{where} 写着它）以状态 {res.returncode} 退出：\n{res.stdout[-1500:]}" \
        + res.stderr[-1500:]


def test_commands_told_elsewhere_exist():
    missing = [f"{'、'.join(sorted(set(files)))}: python -m {m}" for m, files in _named(_sources()).items()
               if m not in NOT_TOOLS and not _exists(m)]
    assert not missing, "这些地方写着 tools/ 里没有的模块：\n" + "\n".join(missing)


def test_course_help_names_existing_tools():
    res = subprocess.run([sys.executable, "course.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                         encoding="utf-8", timeout=TIMEOUT)
    named = [m.group(1) for m in COMMAND.finditer(res.stdout)]
    assert named, res.stdout
    assert all(_exists(m) for m in named), named
