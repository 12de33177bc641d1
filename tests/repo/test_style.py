"""代码风格：pyflakes（未用的 import、未定义的名字）和 pycodestyle 的错误类，行宽 120（pyproject.toml）。"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    res = subprocess.run([ruff, "check", "--select", "E,F,W", "--ignore", "E731", "--output-format", "concise", "."],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
