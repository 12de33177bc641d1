"""旋转位置编码（RoPE），"前一半和后一半配对"的 neox 风格，和 HF 的 rotate_half 一致。

形状约定：positions (N,) 整数；query (N, H_q·D) 或 (N, H_q, D)，key (N, H_kv·D) 或 (N, H_kv, D)
-> 同形状、同 dtype（旋转在 fp32 里做，再转回输入的 dtype）。
cos/sin 表按 (max_position, 2D) 预先算好（每行 [cos, cos, -sin, sin]，各 D/2 列），forward 只查表。
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch

from .base import StateLessOP


@dataclass(frozen=True)
class RotaryConfig:
    """第 2 章就要用，所以定义在算子旁边；第 3 章的 ModelConfig 直接引用它。"""

    head_dim: int
    rotary_dim: int
    max_position: int
    base: float
    scaling: Dict[str, Any] | None


def _default_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Dict[str, Any]) -> torch.Tensor:
    """Llama 3 的频率缩放：长波（低频）除以 factor，短波不动，中间平滑过渡。算式和 HF 一步不差。"""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(StateLessOP):
    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 scaling: Dict[str, Any] | None = None) -> None:
        if rotary_dim != head_size:
            raise ValueError(f"只支持整头旋转：rotary_dim({rotary_dim}) != head_size({head_size})")
        rope_type = (scaling or {}).get("rope_type", "default")
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"不支持的 RoPE 缩放 rope_type={rope_type!r}（支持 default、llama3）")
        self.head_size = head_size
        with torch.device("cpu"):  # 模型可能在 meta 设备上构造；这张表是算出来的，不从检查点加载
            inv_freq = _default_inv_freq(rotary_dim, base)
            if rope_type == "llama3":
                inv_freq = _llama3_inv_freq(inv_freq, scaling)
            freqs = torch.outer(torch.arange(max_position_embeddings, dtype=torch.float32), inv_freq)
            cos, sin = freqs.cos(), freqs.sin()  # 各 (max_pos, D/2)
            # 每行 [cos, cos, -sin, sin]：查一次表就是整头的 cos 和带符号的 sin，旋转只要两次乘一次加
            self._cos_sin_cache = torch.cat([cos, cos, -sin, sin], dim=-1)  # (max_pos, 2D) fp32

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._cos_sin_cache.device != positions.device:
            self._cos_sin_cache = self._cos_sin_cache.to(positions.device)  # 只在第一次换设备时搬一次
        cos, sin = self._cos_sin_cache.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)  # 各 (N, 1, D)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # HF 算 x·cos + rotate_half(x)·sin，rotate_half(x) = [-x2, x1]；负号已经放进表里的 sin，就只剩一次 roll
        shape, d = x.shape, self.head_size
        xf = x.reshape(shape[0], -1, d).float()  # (N, 头数, D)，在 fp32 里转
        return (xf * cos + xf.roll(d // 2, dims=-1) * sin).to(x.dtype).reshape(shape)


@functools.cache
def _get_rope(head_dim: int, rotary_dim: int, max_position: int, base: float,
              scaling: Tuple[Tuple[str, Any], ...] | None) -> RotaryEmbedding:
    return RotaryEmbedding(head_dim, rotary_dim, max_position, base, dict(scaling) if scaling else None)


def get_rope(config: RotaryConfig) -> RotaryEmbedding:
    """同样的配置只建一张表，所有层共用。"""
    scaling = tuple(sorted(config.scaling.items())) if config.scaling else None
    return _get_rope(config.head_dim, config.rotary_dim, config.max_position, config.base, scaling)
