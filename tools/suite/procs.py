"""起一份 pytest、停掉一份（连同它的子孙进程）、截短失败细节；各份的字节码写不写。"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from tools.manifest import ROOT
from tools.suite.parts import Part, wait_measured

STARTED: dict[str, subprocess.Popen] = {}  # 名字 -> 这一份的 pytest 进程（停掉真权重一档时用）
STOPPED: set[str] = set()


def write_bytecode(env: dict) -> dict:
    """设了 PYTHONDONTWRITEBYTECODE（有的容器默认设它）时，一次测试起的两百来个 Python 进程每个都要重新编译仓库里
    同一批源码、重写同一批测试的断言。各份的环境里去掉它：字节码像在多数机器上一样写进源码旁边的 __pycache__
    （.gitignore 里有它；start、trace 复制目录时跳过它），临时目录里的随临时目录一起删掉。"""
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_part(name: str, cmd: list[str], env: dict, nice: int = 0) -> tuple[str, int, str, float, dict, Part]:
    """跑一份 pytest；nice > 0 时调低它（和它起的子进程）的优先级：只在有空闲的核时才轮到它。
    输出写进临时文件（不用管道：要用 os.wait4 等它，顺便拿到峰值内存和 CPU 秒）。"""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        progress, log = Path(d) / "progress.json", Path(d) / "out.txt"
        with open(log, "w", encoding="utf-8") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True,
                                    env=dict(env, MINISGL_PROGRESS=str(progress)))
            STARTED[name] = proc
            if nice and hasattr(os, "setpriority"):
                os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
            used = wait_measured(proc)
        results = json.loads(progress.read_text(encoding="utf-8")) if progress.exists() else {}
        text = log.read_text(encoding="utf-8", errors="replace")
    used.wall_s = time.perf_counter() - t0
    return name, proc.returncode, text, used.wall_s, results, used


def stop(name: str) -> None:
    """停掉还在跑的一份：它的 pytest 进程和它起的全部子孙进程（Linux 上读 /proc 找），不留进程。"""
    proc = STARTED.get(name)
    if proc is None or proc.poll() is not None:
        return
    STOPPED.add(name)
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    todo, tree = [proc.pid], []
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    for pid in tree:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def capped(out: str, cap: int) -> str:
    """保留开头（最先失败的测试）和结尾（short test summary），中间省略。"""
    if len(out) <= cap:
        return out
    tail = min(3000, cap // 4)
    return f"{out[:cap - tail]}\n\n…… 省略 {len(out) - cap} 个字符 ……\n\n{out[-tail:]}"
