"""第 6 章：阶段一的里程碑。

真的起子进程，像读者那样运行：检查点自带的 examples/stage1_milestone.py（页大小 1 和 4），以及规格页上
原样保存的脚本 tests/fixtures/seed_stage1_milestone.py（一字不改，在临时目录里把 models/Qwen3-0.6B
指向离线小模型）。它们打印的判定必须全是 True。三个子进程同时启动，省掉一半的等待。
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.harness.procs import collect

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "tests" / "fixtures" / "seed_stage1_milestone.py"
TIMEOUT = 300
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def milestone_script(checkpoint) -> Path:
    return checkpoint.path / "examples" / "stage1_milestone.py"


@pytest.fixture(scope="module")
def runs(checkpoint, tiny_models, tmp_path_factory) -> dict[str, subprocess.CompletedProcess | None]:
    """名字 -> 运行结果；脚本不存在时是 None（由测试报告失败）。"""
    model = tiny_models["qwen3-tied"]
    env = dict(os.environ, PYTHONPATH=str(checkpoint.path), OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8")
    seed_dir = tmp_path_factory.mktemp("seed_milestone")
    (seed_dir / "models").mkdir()
    try:
        (seed_dir / "models" / "Qwen3-0.6B").symlink_to(model, target_is_directory=True)
    except OSError:  # 不支持符号链接的文件系统：复制一份（小模型不到 1 MB）
        shutil.copytree(model, seed_dir / "models" / "Qwen3-0.6B")
    script = milestone_script(checkpoint)
    commands = {"seed": ([sys.executable, str(SEED)], seed_dir)}
    if script.is_file():
        commands["ps1"] = ([sys.executable, str(script), "--model", str(model)], checkpoint.path)
        commands["ps4"] = ([sys.executable, str(script), "--model", str(model), "--page-size", "4"], checkpoint.path)
    procs = {name: subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, encoding="utf-8", errors="replace")
             for name, (cmd, cwd) in commands.items()}
    results: dict[str, subprocess.CompletedProcess | None] = {"ps1": None, "ps4": None}
    results.update(collect(procs, timeout=TIMEOUT))
    return results


def lines_of(res: subprocess.CompletedProcess | None, what: str) -> list[str]:
    assert res is not None, f"{what} 不存在"
    assert res.returncode == 0, f"{what} 以状态 {res.returncode} 退出：\n{res.stderr[-3000:]}"
    return res.stdout.strip().splitlines()


def check_verdicts(lines: list[str], what: str) -> None:
    verdicts = [line for line in lines if "与 HF 一致" in line]
    assert len(verdicts) == 4, f"{what}：应有 4 行“与 HF 一致”，实际 {len(verdicts)} 行\n" + "\n".join(lines)
    bad = [line for line in verdicts if not line.rstrip().endswith("True")]
    assert not bad, f"{what}：和 HF 不一致：\n" + "\n".join(bad)
    assert lines[-1].startswith("单独跑"), f"{what}：最后一行是 {lines[-1]!r}"
    assert lines[-1].rstrip().endswith("True"), f"{what}：最后一行是 {lines[-1]!r}"


def header(lines: list[str]) -> str:
    found = [line for line in lines if line.startswith("正式结构")]
    assert len(found) == 1, "\n".join(lines)
    return found[0]


def test_task5_milestone_example(checkpoint, runs):
    """examples/stage1_milestone.py：4 个请求一个 batch 与 HF 逐 token 一致，单独跑和放进 batch 相同。"""
    assert milestone_script(checkpoint).is_file(), f"检查点缺少 {milestone_script(checkpoint)}"
    lines = lines_of(runs["ps1"], "stage1_milestone.py")
    check_verdicts(lines, "stage1_milestone.py")
    head = header(lines)
    assert DEVICE in head, head
    assert "torch" in head, head
    assert "1024 页" in head, head


def test_task5_milestone_page_size_4_same_outputs(checkpoint, runs):
    """--page-size 4：判定仍全是 True，解码出的文字和页大小 1 时完全相同。"""
    assert milestone_script(checkpoint).is_file(), f"检查点缺少 {milestone_script(checkpoint)}"
    ps1 = lines_of(runs["ps1"], "stage1_milestone.py")
    ps4 = lines_of(runs["ps4"], "stage1_milestone.py --page-size 4")
    check_verdicts(ps4, "stage1_milestone.py --page-size 4")
    assert "page_size=4" in header(ps4)
    assert "1024 页" in header(ps4)

    def texts(lines):
        return [line for line in lines if line.startswith("单个请求") or "与 HF 一致" in line]

    assert len(texts(ps1)) == 5
    assert texts(ps4) == texts(ps1)

    def kv_line(lines):  # "KV 池写了 87 个槽位（87 / 1024 页）"：槽位数相同，页大小 4 时用的页更少
        [line] = [line for line in lines if line.startswith("KV 池写了")]
        return int(line.split("写了")[1].split("个槽位")[0]), int(line.split("（")[1].split("/")[0])

    (slots1, pages1), (slots4, pages4) = kv_line(ps1), kv_line(ps4)
    assert slots1 == slots4 == pages1, (kv_line(ps1), kv_line(ps4))
    assert pages4 < pages1, (kv_line(ps1), kv_line(ps4))


def test_task5_seed_script_unchanged(runs):
    """规格页上的脚本原样运行：接口和规格一致，判定全是 True。"""
    lines = lines_of(runs["seed"], "seed_stage1_milestone.py")
    verdicts = [line for line in lines if "与 HF 一致" in line]
    assert len(verdicts) == 4, "\n".join(lines)
    assert all(line.rstrip().endswith("与 HF 一致: True") for line in verdicts), "\n".join(lines)
    assert lines[-1].rstrip().endswith("True"), lines[-1]
    head = header(lines)
    assert DEVICE in head, head
    assert "torch" in head, head
    assert "1024 页" in head, head
