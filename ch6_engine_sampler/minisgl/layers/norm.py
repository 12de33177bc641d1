"""RMSNorm：x / sqrt(mean(x²) + eps) * weight。weight: (size,)；x: (..., size)，形状不变。

计算顺序和 HF 一致：先在 fp32 里归一化，转回输入的 dtype，再乘 weight。融合形式（加残差再归一化）
在这里不原地改输入，读起来更直白。
"""

from __future__ import annotations

from typing import Tuple

import torch

from .base import BaseOP


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # 逐个算子照抄 HF 的写法，结果逐位相同；CPU 上 F.rms_norm 也是拆成这几步算的，并不更快
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


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
        if residual is not None:
            x = x + residual
        return rms_norm(x, self.weight, self.eps), x
