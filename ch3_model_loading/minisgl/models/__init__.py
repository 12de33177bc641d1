from .base import BaseLLMModel
from .config import ModelConfig, RotaryConfig, load_hf_config
from .register import get_model_class
from .weight import load_weight


def create_model(model_config: ModelConfig) -> BaseLLMModel:
    return get_model_class(model_config.architectures[0], model_config)


__all__ = ["BaseLLMModel", "ModelConfig", "RotaryConfig", "create_model", "load_hf_config", "load_weight"]
