"""真权重一档（--real 或 MINISGL_REAL=1 时才收集）：Qwen3-0.6B 上逐 token 对齐 HF。

要了这一档却没有权重，测试失败并给出下载命令，而不是悄悄跳过。
"""

import os
from pathlib import Path

import pytest

from tests.harness.course import PROMPTS, ROOT
from tests.harness.parity import parity_failures

DOWNLOAD = "hf download Qwen/Qwen3-0.6B --local-dir models/Qwen3-0.6B"
REAL_NEW_TOKENS = 16


@pytest.fixture(scope="session")
def real_model() -> Path:
    path = Path(os.environ.get("MINISGL_MODEL", ROOT / "models" / "Qwen3-0.6B"))
    if not (path / "config.json").is_file() or not list(path.glob("*.safetensors")):
        pytest.fail(f"要求了真权重一档，但 {path} 里没有 config.json 和 *.safetensors。下载：\n    {DOWNLOAD}\n"
                    f"（或者用 MINISGL_MODEL 指向已有的目录）", pytrace=False)
    return path


def test_real_weights_parity(checkpoint, real_model):
    ps = checkpoint.page_sizes[-1]
    failures = parity_failures(checkpoint.entry_path, real_model, PROMPTS, REAL_NEW_TOKENS, ps)
    assert not failures, "\n\n".join(failures)
