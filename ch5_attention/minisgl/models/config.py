"""ModelConfig：从 Hugging Face 的配置对象里取出引擎需要的那几个数。

用 transformers 的 AutoConfig 读 config.json：hub 上 transformers 4 写的老形式（顶层 rope_theta / rope_scaling）
和 transformers 5 的新形式（rope_parameters）都由它归一成 rope_parameters，这里不用自己分辨。
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from minisgl.layers.rotary import RotaryConfig

__all__ = ["ModelConfig", "RotaryConfig"]


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    intermediate_size: int
    rms_norm_eps: float
    rotary_config: RotaryConfig
    hidden_act: str
    tie_word_embeddings: bool
    model_type: str
    architectures: list[str]

    @classmethod
    def from_hf(cls, config: PretrainedConfig) -> "ModelConfig":
        config = getattr(config, "text_config", None) or config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        rope = dict(getattr(config, "rope_parameters", None) or {})
        base = rope.get("rope_theta", getattr(config, "rope_theta", None))
        if base is None:
            raise ValueError(f"{config.model_type} 的配置里找不到 rope_theta（rope_parameters={rope}）")
        scaling = rope if rope.get("rope_type", "default") != "default" else None
        return cls(
            num_layers=config.num_hidden_layers,
            num_qo_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=head_dim,
            hidden_size=config.hidden_size,
            vocab_size=config.vocab_size,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            rotary_config=RotaryConfig(head_dim, head_dim, config.max_position_embeddings, float(base), scaling),
            hidden_act=config.hidden_act,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            model_type=config.model_type,
            architectures=list(config.architectures or ["LlamaForCausalLM"]),
        )
