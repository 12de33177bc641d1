"""真权重一档的提示词（用哪个模型、没有时怎么说在 tools/models/find.py）。"""

from __future__ import annotations

from tools.manifest import LONG_PROMPT

# 英文、中文、代码各两条以上，外加长提示词；真模型上每条 32 个新 token，够走出几十步 decode
REAL_PROMPTS = ["The capital of France is", "Once upon a time,", "法国的首都是", "从前有一座山，山里有",
                "def fibonacci(n):", "for i in range(10):", LONG_PROMPT]
REAL_NEW_TOKENS = 32
