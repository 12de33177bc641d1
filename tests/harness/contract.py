"""所有检查点共同回答的命令行契约：

    python CHECKPOINT/generate.py --model DIR --prompt TEXT [--prompt TEXT ...] --max-new-tokens N
                                  [--page-size P] [--json] [--dump-logits FILE]

--json 时 stdout 最后一行是 {"outputs": [[token ids], ...]}。--dump-logits 是可选的：
出现不一致时，测试用它取回"我们这一边"每一步的 logits 来写报告。
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path


class ContractError(RuntimeError):
    pass


def build_argv(model: str | Path, prompts: list[str], n: int, page_size: int | None = None,
               dump_logits: str | Path | None = None) -> list[str]:
    argv = ["--model", str(model), "--max-new-tokens", str(n), "--json"]
    for p in prompts:
        argv += ["--prompt", p]
    if page_size is not None:
        argv += ["--page-size", str(page_size)]
    if dump_logits is not None:
        argv += ["--dump-logits", str(dump_logits)]
    return argv


def run_in_process(entry: Path, argv: list[str]) -> str:
    """在当前进程里按 __main__ 运行入口脚本，返回它的 stdout。

    每个检查点的测试各用一个 pytest 进程（它们都有一个叫 minisgl 的包），所以同一进程里只有一个
    minisgl；这里省掉的只是每次重新 import torch 的几秒。脚本以非零状态退出时抛 ContractError。"""
    buf = io.StringIO()
    old_argv = sys.argv
    sys.argv = [str(entry), *argv]
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(str(entry), run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise ContractError(f"{entry.name} {' '.join(argv)} 以状态 {e.code} 退出：\n{buf.getvalue()}") from e
    finally:
        sys.argv = old_argv
    return buf.getvalue()


def run_subprocess(entry: Path, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(entry.parent))
    return subprocess.run([sys.executable, str(entry), *argv], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=entry.parent)


def parse_outputs(stdout: str, num_prompts: int, n: int) -> list[list[int]]:
    lines = stdout.strip().splitlines()
    if not lines:
        raise ContractError("没有任何输出：--json 时最后一行应是 {\"outputs\": ...}")
    try:
        outputs = json.loads(lines[-1])["outputs"]
    except (ValueError, KeyError, TypeError) as e:
        raise ContractError(f"最后一行不是 {{\"outputs\": [[...], ...]}}：{lines[-1][:200]!r}") from e
    if len(outputs) != num_prompts:
        raise ContractError(f"给了 {num_prompts} 个提示词，outputs 却有 {len(outputs)} 个")
    for i, out in enumerate(outputs):
        if len(out) != n or not all(isinstance(t, int) for t in out):
            raise ContractError(f"第 {i} 个提示词应正好生成 {n} 个整数 token，实际是 {out!r}")
    return outputs
