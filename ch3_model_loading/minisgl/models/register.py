"""按 config.json 里的 architectures[0] 找模型类。

和官方一样，注册表只记名字（模块, 类名），用到时才 import：读配置、查结构不必先把全部模型类装进来。
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import BaseLLMModel
    from .config import ModelConfig

_MODEL_REGISTRY: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": (".decoder", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": (".decoder", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": (".decoder", "Qwen3ForCausalLM"),
}


def check_architecture(model_architecture: str, source: str = "") -> None:
    """load_hf_config（在查必需字段之前：GPT-2 之类的配置缺字段，先说结构不支持才对）和 get_model_class 共用。"""
    if model_architecture not in _MODEL_REGISTRY:
        raise ValueError(f"{source + ': ' if source else ''}不支持的模型结构 {model_architecture!r}；"
                         f"支持：{', '.join(sorted(_MODEL_REGISTRY))}")


def get_model_class(model_architecture: str, model_config: ModelConfig) -> BaseLLMModel:
    check_architecture(model_architecture)
    module, name = _MODEL_REGISTRY[model_architecture]
    return getattr(importlib.import_module(module, __package__), name)(model_config)
