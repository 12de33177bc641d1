"""真权重一档的夹具（--real 或 MINISGL_REAL=1 时才收集）。

要了这一档却没有模型：失败并给出做模型的命令，从不悄悄跳过。检查点支持不了这个模型的结构（第 0~2 步只有
Qwen3）：跳过，理由写明是哪个检查点、哪种结构——run_tests.py 会把理由打印出来。"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.models.find import find_model, has_weights, missing_message, unsupported_reason


@pytest.fixture(scope="session")
def real_model(checkpoint) -> Path:
    choice = find_model()
    path = choice.path if choice else None
    if path is None or not has_weights(path):
        pytest.fail(missing_message(path), pytrace=False)
    if (why := unsupported_reason(checkpoint, path)) is not None:
        pytest.skip(f"真权重一档在这个检查点上不适用，没有跑：{why}")
    return path
