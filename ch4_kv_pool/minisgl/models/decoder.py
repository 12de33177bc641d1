"""一个 decoder 文件装下 Qwen3、Qwen2.5 和 Llama 3：三者只差两个开关。

| 家族 | q/k/v 有 bias | q/k 每头先 RMSNorm |
|---|---|---|
| Llama 3 | 否 | 否 |
| Qwen2 / Qwen2.5 | 是 | 否 |
| Qwen3 | 否 | 是 |

官方为每个家族各写一个几乎相同的文件；这里用子类只设开关，读者一眼看出差别在哪。
"""

from __future__ import annotations

from typing import Tuple

import torch

from minisgl.core import get_global_ctx
from minisgl.layers import (AttentionLayer, BaseOP, LinearColParallelMerged, LinearOProj, LinearQKVMerged,
                            LinearRowParallel, OPList, ParallelLMHead, RMSNorm, RMSNormFused, VocabParallelEmbedding,
                            silu_and_mul)

from .base import BaseLLMModel
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
        if config.hidden_act != "silu":
            raise ValueError(f"不支持的激活函数 hidden_act={config.hidden_act!r}（支持 silu）")
        inter = config.intermediate_size
        self.gate_up_proj = LinearColParallelMerged(config.hidden_size, [inter, inter], has_bias=False)
        self.down_proj = LinearRowParallel(inter, config.hidden_size, has_bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(silu_and_mul(self.gate_up_proj.forward(x)))


class DecoderLayer(BaseOP):
    def __init__(self, config: ModelConfig, layer_id: int, has_attn_bias: bool, has_qk_norm: bool) -> None:
        self.self_attn = RopeAttn(config, layer_id, has_attn_bias=has_attn_bias, has_qk_norm=has_qk_norm)
        self.mlp = GatedMLP(config)
        self.input_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNormFused(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> Tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


class DecoderModel(BaseOP):
    def __init__(self, config: ModelConfig, has_attn_bias: bool, has_qk_norm: bool) -> None:
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = OPList([DecoderLayer(config, i, has_attn_bias, has_qk_norm) for i in range(config.num_layers)])
        self.norm = RMSNormFused(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens.forward(input_ids), None
        for layer in self.layers.op_list:
            x, residual = layer.forward(x, residual)
        return self.norm.forward(x, residual)[0]


class DecoderForCausalLM(BaseLLMModel):
    has_attn_bias = False
    has_qk_norm = False

    def __init__(self, config: ModelConfig) -> None:
        self.model = DecoderModel(config, self.has_attn_bias, self.has_qk_norm)
        tie = config.tie_word_embeddings
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tie_word_embeddings=tie,
                                      tied_embedding=self.model.embed_tokens if tie else None)

    def forward(self) -> torch.Tensor:
        return self.lm_head.forward(self.model.forward(get_global_ctx().batch.input_ids))


class LlamaForCausalLM(DecoderForCausalLM):
    pass


class Qwen2ForCausalLM(DecoderForCausalLM):
    has_attn_bias = True


class Qwen3ForCausalLM(DecoderForCausalLM):
    has_qk_norm = True
