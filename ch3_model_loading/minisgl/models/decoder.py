"""一个 decoder 文件装下 Qwen3、Qwen2.5 和 Llama 3：三者只差两个开关。

| 家族 | q/k/v 有 bias | q/k 每头先 RMSNorm |
|---|---|---|
| Llama 3 | 否 | 否 |
| Qwen2 / Qwen2.5 | 是 | 否 |
| Qwen3 | 否 | 是 |

官方为每个家族各写一个几乎相同的文件；这里用子类只设开关，读者一眼看出差别在哪。
共用的 RopeAttn、GatedMLP 和官方一样放在 models/utils.py。
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

import torch

from minisgl.core import get_global_ctx
from minisgl.layers import BaseOP, OPList, ParallelLMHead, RMSNormFused, VocabParallelEmbedding

from .base import BaseLLMModel
from .utils import GatedMLP, RopeAttn

if TYPE_CHECKING:
    from .config import ModelConfig


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
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

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
