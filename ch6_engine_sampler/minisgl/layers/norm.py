"""RMSNorm：x / sqrt(mean(x²) + eps) * weight。weight: (size,)；x: (..., size)，形状不变。

计算顺序和 HF 一致：先在 fp32 里归一化，转回输入的 dtype，再乘 weight。融合形式（加残差再归一化）
在这里不原地改输入，读起来更直白。第 6 章起算式在 minisgl/kernel（CPU 上是一次 C++ 调用，其余是原来的 PyTorch 算式）。
"""

from __future__ import annotations

from typing import Tuple

import torch

from minisgl.kernel import add_rms_norm, rms_norm  # 同签名；怎么算由 minisgl/kernel 决定

from .base import BaseOP


class RMSNorm(BaseOP):
    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class RMSNormFused(BaseOP):
    """残差相加和归一化合成一步：返回 (norm(x + residual), x + residual)；residual 为 None 时就是 x 自己。"""

    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return rms_norm(x, self.weight, self.eps), x
        return add_rms_norm(x, residual, self.weight, self.eps)
