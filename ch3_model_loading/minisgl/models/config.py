"""ModelConfig：从 Hugging Face 的配置对象里取出引擎需要的那几个数。

用 transformers 的 AutoConfig 读 config.json：hub 上 transformers 4 写的老形式（顶层 rope_theta / rope_scaling）
和 transformers 5 的新形式（rope_parameters）都由它归一成 rope_parameters，这里不用自己分辨。
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from transformers import AutoConfig, PretrainedConfig

from minisgl.layers.rotary import RotaryConfig

from .register import check_architecture

__all__ = ["ModelConfig", "RotaryConfig", "load_hf_config"]

# config.json 里必须写明的字段：transformers 对缺的字段会悄悄填上默认值（比如 hidden_size=4096），
# 那样的错要等到加载权重时才以形状不符的面目出现
NEEDED_FIELDS = ("architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "vocab_size", "max_position_embeddings", "rms_norm_eps")


def load_hf_config(model_path: str) -> PretrainedConfig:
    """读模型目录的 config.json：目录、文件、结构、必需字段，哪里不对就说出哪里，再交给 AutoConfig。

    transformers 自己的校验不通过（比如 num_hidden_layers 和 layer_types 的长度不同）时，也是一行 ValueError：
    "config.json：transformers 不接受这个配置：…"，而不是 huggingface_hub 的多行异常链。"""
    if not os.path.exists(model_path):
        raise FileNotFoundError(f"模型目录 {model_path!r} 不存在。下载真权重："
                                f"hf download Qwen/Qwen3-0.6B --local-dir models/Qwen3-0.6B")
    if not os.path.isdir(model_path):
        raise NotADirectoryError(f"模型路径 {model_path!r} 不是目录：要给 Hugging Face 格式的模型目录")
    file = os.path.join(model_path, "config.json")
    if not os.path.isfile(file):  # 别让 AutoConfig 把它当成 hub 上的名字去联网
        raise FileNotFoundError(f"模型目录 {model_path!r} 里没有 config.json（或者它不是普通文件）")
    try:
        with open(file) as f:
            raw = json.load(f)
    except ValueError as e:
        raise ValueError(f"{file} 不是有效的 JSON：{e}") from None
    text = raw.get("text_config") or raw  # 多模态模型的文本部分
    missing = [k for k in NEEDED_FIELDS if k not in text and k not in raw]
    archs = raw.get("architectures") or text.get("architectures") or []
    if archs:
        check_architecture(archs[0], source=file)
    if missing:
        raise ValueError(f"{file} 缺少必需的字段 {missing}")
    try:
        return AutoConfig.from_pretrained(model_path)
    except Exception as e:  # transformers 自己的校验（层数和 layer_types、rope_parameters…）：原话常是多行的异常链
        cause = e.__cause__ or e
        reason = " ".join(str(cause.args[0] if isinstance(cause, KeyError) and cause.args else cause).split())
        raise ValueError(f"{file}：transformers 不接受这个配置：{reason}") from None


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
        sliding = [i for i, t in enumerate(getattr(config, "layer_types", None) or []) if t != "full_attention"]
        if sliding:  # 否则按全注意力算，序列长过窗口后 token 和 HF 不同。use_sliding_window=false 时 HF 给的全是 full
            raise ValueError(f"{config.model_type} 的配置让第 {sliding} 层用 {config.layer_types[sliding[0]]}"
                             f"（sliding_window={getattr(config, 'sliding_window', None)}）：阶段一只实现全注意力")
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
