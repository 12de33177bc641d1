"""整个进程看得到模拟的 CUDA（环境变量 MINISGL_EMULATE_CUDA=1，python course.py test ch6 --emulate-cuda 设它）。

gpu 夹具只让用它的测试看到 GPU；GPU 机器上却是整个进程、连同它起的子进程都看得到：EngineConfig(device="auto")
建的每个引擎都在 cuda:0 上，generate.py、里程碑脚本、TP 的各个 rank 也一样。这里照这样做：

- 本进程：进入 emulated_cuda()，直到进程结束（start()；tests/conftest.py 的 pytest_configure 调它）；
- Python 子进程：sys.executable 和 multiprocessing 的 spawn 都换成一个小脚本（python-emu），它把 boot/ 放到
  PYTHONPATH 最前面再 exec 真的解释器；boot/sitecustomize.py 在解释器启动时调 start()。测试自己写死
  PYTHONPATH（很多都写死成检查点目录）也挡不住它。这个小脚本是 sh 写的：Linux、macOS 上才有这个开关。
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shlex
import sys
from pathlib import Path

from . import CACHE, HERE, emulated_cuda, guard_problem

ENV = "MINISGL_EMULATE_CUDA"
BOOT = HERE / "boot"
_ENTERED: list = []  # 进入了的 emulated_cuda()：留着，不退出（进程里的张量到最后都是 cuda 上的）


def active() -> bool:
    return bool(_ENTERED)


def _launcher(real: str) -> Path:
    """写一个 sh 脚本：带上开关和 boot/，再 exec 真的解释器（按内容命名，并行的进程写同一份也无妨）。"""
    text = ("#!/bin/sh\n# 模拟的 CUDA 的子进程（tests/harness/cuda_emu/whole.py）：解释器启动时就进入模拟\n"
            f"export {ENV}=1\n"
            f'export PYTHONPATH={shlex.quote(str(BOOT))}"${{PYTHONPATH:+:$PYTHONPATH}}"\n'
            f'exec {shlex.quote(real)} "$@"\n')
    path = CACHE / f"python-emu-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
    if not path.exists() or path.read_text() != text:
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)
    return path


def start() -> str | None:
    """进入整个进程的模拟，并让之后起的 Python 子进程也进入；用不了时返回原因（一句话），什么也不改。"""
    if active():
        return None
    problem = guard_problem()
    if problem is not None:
        return problem
    real = os.environ.get("MINISGL_EMULATE_REAL_PYTHON") or sys.executable
    os.environ["MINISGL_EMULATE_REAL_PYTHON"] = real  # 子进程的 sys.executable 是真的解释器：脚本只写一份
    launcher = str(_launcher(real))
    sys.executable = launcher
    multiprocessing.set_executable(launcher)  # spawn 起的 rank（有 CUDA 时 TP 用 spawn）
    entered = emulated_cuda()
    entered.__enter__()
    _ENTERED.append(entered)
    return None
