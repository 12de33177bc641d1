"""RMSNorm：x / sqrt(mean(x²) + eps) * weight。weight: (size,)；x: (..., size)，形状不变。

计算顺序和 HF 一致：先在 fp32 里归一化，转回输入的 dtype，再乘 weight。融合形式（加残差再归一化）
在这里不原地改输入，读起来更直白。第 6 章起，加载权重时按权重的设备和 dtype 选一次：CPU 上的 fp32 换成
minisgl/kernel 里同签名的 C++ 版（一次调用），其余照旧用下面的算式。
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from minisgl.kernel import cpu_op

from .base import _STATE_DICT, BaseOP


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # F.rms_norm 不带 weight 就是 HF 的 x·rsqrt(mean(x²) + eps)，逐位相同；weight 留在转回 dtype 之后乘，
    # bf16 下才和 HF 一样。一次调用顶替五个小算子：decode 每步每层要做两三次，少付几次调度开销
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


class RMSNorm(BaseOP):
    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)
        self._rms_norm = rms_norm

    def load_state_dict(self, state_dict: _STATE_DICT, *, prefix: str = "", _internal: bool = False) -> None:
        super().load_state_dict(state_dict, prefix=prefix, _internal=_internal)
        self._rms_norm = cpu_op("rms_norm", self.weight) or rms_norm  # 权重到了才知道设备和 dtype：只选这一次

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._rms_norm(x, self.weight, self.eps)


class RMSNormFused(BaseOP):
    """残差相加和归一化合成一步：返回 (norm(x + residual), x + residual)；residual 为 None 时就是 x 自己。"""

    def __init__(self, size: int, eps: float) -> None:
        self.eps = eps
        self.weight = torch.empty(size)
        self._rms_norm, self._add_rms_norm = rms_norm, None

    def load_state_dict(self, state_dict: _STATE_DICT, *, prefix: str = "", _internal: bool = False) -> None:
        super().load_state_dict(state_dict, prefix=prefix, _internal=_internal)
        self._rms_norm = cpu_op("rms_norm", self.weight) or rms_norm
        self._add_rms_norm = cpu_op("add_rms_norm", self.weight)  # 加残差和归一化一次调用；None：下面的两步

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Tuple[torch.Tensor, torch.Tensor]:
        if residual is not None and self._add_rms_norm is not None:
            return self._add_rms_norm(x, residual, self.weight, self.eps)
        if residual is not None:
            x = x + residual
        return self._rms_norm(x, self.weight, self.eps), x
