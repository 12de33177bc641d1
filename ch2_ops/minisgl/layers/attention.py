"""注意力层：把合并的 qkv 拆开，（Qwen3）每个头先做 RMSNorm，再旋转位置，然后算注意力。

形状约定：qkv (N, (H_q + 2·H_kv)·D) -> (N, H_q·D)，H 是本 rank 的头数。
注意力的算术和 KV 的存放本章还是朴素的（minisgl/naive.py），第 4、5 章再换。
"""

from __future__ import annotations

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import get_tp_info
from minisgl.naive import naive_attention
from minisgl.utils import div_even

from .base import StateLessOP
from .norm import RMSNorm
from .rotary import RotaryConfig, get_rope


class AttentionLayer(StateLessOP):
    def __init__(self, layer_id: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 rotary_config: RotaryConfig, q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None) -> None:
        tp = get_tp_info().size
        self.layer_id = layer_id
        self.head_dim = head_dim
        self.num_qo_heads = div_even(num_qo_heads, tp)
        self.num_kv_heads = div_even(num_kv_heads, tp, allow_replicate=True)
        self.qo_attn_dim, self.kv_attn_dim = self.num_qo_heads * head_dim, self.num_kv_heads * head_dim
        self.rotary = get_rope(rotary_config)
        self.q_norm, self.k_norm = q_norm, k_norm  # 权重归外层的 RopeAttn 管，这里只是借用

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.split([self.qo_attn_dim, self.kv_attn_dim, self.kv_attn_dim], dim=-1)
        if self.q_norm is not None:
            q = self.q_norm.forward(q.reshape(-1, self.num_qo_heads, self.head_dim))
        if self.k_norm is not None:
            k = self.k_norm.forward(k.reshape(-1, self.num_kv_heads, self.head_dim))
        q, k = self.rotary.forward(get_global_ctx().batch.positions, q, k)
        o = naive_attention(q.reshape(-1, self.num_qo_heads, self.head_dim),
                            k.reshape(-1, self.num_kv_heads, self.head_dim),
                            v.reshape(-1, self.num_kv_heads, self.head_dim), self.layer_id)
        return o.reshape(-1, self.qo_attn_dim)
