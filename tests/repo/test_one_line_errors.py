"""course.py start / check / trace、tools.run_tests 和 tools.book.carry_forward 用错了：
只打印一行 错误：…，说出是哪个参数，不打印 Traceback。"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CASES = {
    "start_unknown_chapter": (["course.py", "start", "ch9"], "'ch9'"),
    "start_without_chapter": (["course.py", "start"], "course.py start chN"),
    "start_into_existing_dir": (["course.py", "start", "ch6", "docs"], "已经存在"),
    "carry_forward_unknown_chapter": (["-m", "tools.book.carry_forward", "ch9", "x.py"], "'ch9'"),
    "carry_forward_missing_file": (["-m", "tools.book.carry_forward", "ch2", "nope.py"], "nope.py 不存在"),
    "run_tests_unknown_checkpoint": (["-m", "tools.run_tests", "ch9"], "'ch9'"),
    "run_tests_directory_without_as": (["-m", "tools.run_tests", "docs"], "--as"),
    "check_unknown_checkpoint": (["course.py", "check", "ch9"], "'ch9'"),
    "trace_unknown_checkpoint": (["course.py", "trace", "ch9"], "'ch9'"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_misuse_is_one_error_line(name):
    argv, culprit = CASES[name]
    res = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode != 0, f"{name}：用错了却正常退出\n{res.stdout[-2000:]}"
    assert "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    assert out and out[-1].startswith("错误：") and culprit in out[-1], out[-3:]
