"""真模型的目录和做、取它们的命令：整个仓库只在这里拼出这些名字。

find.py（用哪个模型）和 make_smollm2.py（做一个）都从这里读：谁也不用为了一个名字 import 对方，两者不成环。
"""

from __future__ import annotations

from tools.manifest import ROOT

QWEN3 = ROOT / "models" / "Qwen3-0.6B"
SMOLLM2 = ROOT / "models" / "SmolLM2-135M"
TINY_DEMO = "qwen3-tied"  # 退回时用的离线小模型（tools/models/make_tiny_models.py 的名字）
MAKE_SMOLLM2 = "python -m tools.models.make_smollm2"
DOWNLOAD_QWEN3 = "hf download Qwen/Qwen3-0.6B --local-dir models/Qwen3-0.6B"
