"""给书里的"对不上时报告长什么样"现跑一份真的报告（docs/testing.md 用 {{ run(...) }} 调它）。

把第 0 步的骨架复制到临时目录，故意跳过 post_attention_layernorm，再用对齐测试同一套代码
（tests/harness/parity.py）和 HF 比，打印第一份报告。报告的格式一改，书上的样子跟着变。

    python -m tests.harness.report_demo
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from tests.harness.parity import parity_failures
from tools.models.make_tiny_models import make_all
from tools.manifest import PROMPTS, ROOT, TINY_NEW_TOKENS

BUG = ('h = rms_norm(x, W[p + "post_attention_layernorm.weight"])', "h = x")


def main() -> int:
    model = make_all(names=["qwen3-tied"])["qwen3-tied"]
    with tempfile.TemporaryDirectory() as d:
        dst = Path(d) / "step0_skeleton"
        shutil.copytree(ROOT / "step0_skeleton", dst, ignore=shutil.ignore_patterns("__pycache__"))
        src = (dst / "skeleton.py").read_text(encoding="utf-8")
        if src.count(BUG[0]) != 1:
            raise SystemExit(f"错误：step0_skeleton/skeleton.py 里找不到要改坏的那一行：{BUG[0]!r}")
        (dst / "skeleton.py").write_text(src.replace(*BUG), encoding="utf-8")
        failures = parity_failures(dst / "skeleton.py", model, PROMPTS[:1], TINY_NEW_TOKENS, in_process=True)
    if not failures:
        raise SystemExit("错误：改坏了骨架，对齐测试却没有发现：测试框架出问题了")
    print(failures[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
