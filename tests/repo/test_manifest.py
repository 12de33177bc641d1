"""tools/manifest.py 的 use_checkpoint：工具要某一章的 minisgl 时只走它。子进程里测，不碰本进程的 sys.modules。"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess:
    code = "from tools.manifest import use_checkpoint\n" + code.replace("; ", "\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_use_checkpoint_puts_that_chapter_first():
    res = _run("use_checkpoint('ch4'); import minisgl; print(minisgl.__file__)")
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()).parent == ROOT / "ch4_kv_pool" / "minisgl"


def test_use_checkpoint_refuses_a_second_chapter():
    """同一个进程换另一章：报错说出已经 import 的是哪一份，而不是悄悄用着旧的那份。"""
    res = _run("use_checkpoint('ch4'); import minisgl; use_checkpoint('ch5')")
    assert res.returncode != 0 and "ch4_kv_pool" in res.stderr and "ch5_attention" in res.stderr, res.stderr[-2000:]
    same = _run("use_checkpoint('ch4'); import minisgl; use_checkpoint('ch4')")
    assert same.returncode == 0, same.stderr
