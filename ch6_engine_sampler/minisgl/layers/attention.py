"""注意力层：把合并的 qkv 拆开，（Qwen3）每个头先做 RMSNorm，再旋转位置，然后算注意力。

形状约定：qkv (N, (H_q + 2·H_kv)·D) -> (N, H_q·D)，H 是本 rank 的头数。
写 KV 和算注意力都交给 ctx.attn_backend（第 5 章）：换后端不用动这里。
"""

from __future__ import annotations

import torch

from minisgl.core import get_global_ctx
from minisgl.distributed import get_tp_info
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
        ctx = get_global_ctx()
        q, k = self.rotary.forward(ctx.batch.positions, q, k)
        o = ctx.attn_backend.forward(q.reshape(-1, self.num_qo_heads, self.head_dim), k, v, self.layer_id, ctx.batch)
        return o.reshape(-1, self.qo_attn_dim)
