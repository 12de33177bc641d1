"""按 config.json 里的 architectures[0] 找模型类。"""

from __future__ import annotations

from .base import BaseLLMModel
from .config import ModelConfig
from .decoder import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM

_MODEL_REGISTRY: dict[str, type[BaseLLMModel]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def supported_architectures() -> list[str]:
    return sorted(_MODEL_REGISTRY)


def get_model_class(model_architecture: str, model_config: ModelConfig) -> BaseLLMModel:
    if model_architecture not in _MODEL_REGISTRY:
        raise ValueError(f"不支持的模型结构 {model_architecture!r}；支持：{', '.join(supported_architectures())}")
    return _MODEL_REGISTRY[model_architecture](model_config)
