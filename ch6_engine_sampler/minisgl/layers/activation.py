"""门控激活：x 的前一半过 SiLU，乘以后一半。x: (N, 2I) -> (N, I)。"""

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
