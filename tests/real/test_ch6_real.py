"""真权重一档，第 6 章起：里程碑脚本在真模型上跑（读得懂的续写、4 个"与 HF 一致: True"），
以及张量并行：generate.py --tp 3（SmolLM2 的 9 个 q 头、3 个 KV 头都能被 3 整除）和 --tp 1 逐 token 相同。"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.harness.real import REAL_NEW_TOKENS, REAL_PROMPTS

TIMEOUT = 900


def _env(checkpoint) -> dict:
    return dict(os.environ, PYTHONPATH=str(checkpoint.path), OMP_NUM_THREADS="1", PYTHONIOENCODING="utf-8")


def test_real_milestone(checkpoint, real_model):
    script = checkpoint.path / "examples" / "stage1_milestone.py"
    res = subprocess.run([sys.executable, str(script), "--model", str(real_model)], cwd=checkpoint.path,
                         env=_env(checkpoint), capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    verdicts = [line for line in lines if "与 HF 一致" in line]
    assert len(verdicts) == 4, res.stdout
    assert all(v.rstrip().endswith("与 HF 一致: True") for v in verdicts), res.stdout
    assert lines[-1].rstrip().endswith("True"), res.stdout
    single = next(line for line in lines if line.startswith("单个请求"))
    assert "Paris" in single, single  # 真模型：读得懂的续写


def tp_size(model) -> int:
    """3 份优先（SmolLM2：9 / 3 个头、1536 的 MLP）；切不开时用 2（Qwen3-0.6B：16 / 8 个头）。"""
    cfg = json.loads((model / "config.json").read_text())
    dims = [cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"]]
    return next(tp for tp in (3, 2) if all(d % tp == 0 for d in dims))


def test_real_tp_equals_tp1(checkpoint, real_model, ours):
    tp = tp_size(real_model)
    args = ["--model", str(real_model), "--max-new-tokens", str(REAL_NEW_TOKENS), "--json", "--tp", str(tp),
            "--dist-timeout", "600"]
    for p in REAL_PROMPTS:
        args += ["--prompt", p]
    res = subprocess.run([sys.executable, str(checkpoint.entry_path), *args], cwd=checkpoint.path,
                         env=_env(checkpoint), capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr[-3000:]
    outs = json.loads(res.stdout.strip().splitlines()[-1])["outputs"]
    tp1 = ours(1)  # 和 HF 的对齐由 test_real_weights_parity 负责
    diff = [i for i, (a, b) in enumerate(zip(outs, tp1)) if a != b]
    assert not diff, f"--tp {tp} 和 --tp 1 在第 {diff} 条提示词上不同：{outs} vs {tp1}"
    assert len(outs) == len(tp1), f"--tp {tp} 和 --tp 1 在第 {diff} 条提示词上不同：{outs} vs {tp1}"
