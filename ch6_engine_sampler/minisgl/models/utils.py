"""三个家族共用的两块：带 RoPE 的注意力和门控 MLP（文件名、类名与官方一致）。
第 6 章起 MLP 加载权重时选一次激活（官方在构造时绑定 act_fn）：CPU 上的 fp32 换成 minisgl/kernel 的 C++ 版。"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.kernel import cpu_op
from minisgl.layers import (AttentionLayer, BaseOP, LinearColParallelMerged, LinearOProj, LinearQKVMerged,
                            LinearRowParallel, RMSNorm, silu_and_mul)
from minisgl.layers.base import _STATE_DICT

if TYPE_CHECKING:
    from .config import ModelConfig


class RopeAttn(BaseOP):
    def __init__(self, config: ModelConfig, layer_id: int, *, has_attn_bias: bool = False,
                 has_qk_norm: bool = False) -> None:
        self.qkv_proj = LinearQKVMerged(config.hidden_size, config.head_dim, config.num_qo_heads,
                                        config.num_kv_heads, has_bias=has_attn_bias)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if has_qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if has_qk_norm else None
        self.attn = AttentionLayer(layer_id, config.num_qo_heads, config.num_kv_heads, config.head_dim,
                                   config.rotary_config, q_norm=self.q_norm, k_norm=self.k_norm)
        self.o_proj = LinearOProj(config.head_dim * config.num_qo_heads, config.hidden_size, has_bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj.forward(self.attn.forward(self.qkv_proj.forward(x)))


class GatedMLP(BaseOP):
    def __init__(self, config: ModelConfig) -> None:
        if config.hidden_act != "silu":  # 官方还有 gelu；三个家族都用 silu
            raise ValueError(f"不支持的激活函数 hidden_act={config.hidden_act!r}（支持 silu）")
        inter = config.intermediate_size
        self.gate_up_proj = LinearColParallelMerged(config.hidden_size, [inter, inter], has_bias=False)
        self.down_proj = LinearRowParallel(inter, config.hidden_size, has_bias=False)
        self._act_fn = silu_and_mul

    def load_state_dict(self, state_dict: _STATE_DICT, *, prefix: str = "", _internal: bool = False) -> None:
        super().load_state_dict(state_dict, prefix=prefix, _internal=_internal)
        self._act_fn = cpu_op("silu_and_mul", self.gate_up_proj.weight) or silu_and_mul  # 激活的输入就在这个设备上

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(self._act_fn(self.gate_up_proj.forward(x)))
