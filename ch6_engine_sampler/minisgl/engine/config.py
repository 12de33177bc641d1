from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import List

import torch
from transformers import AutoConfig, PretrainedConfig

from minisgl.distributed import DistributedInfo
from minisgl.models import ModelConfig


@dataclass(frozen=True)
class EngineConfig:
    """字段与官方一致。CPU 上 num_page_override 不给时按可用内存估算，但不会超过 max_running_req 条
    满长序列用得到的页数。"""

    model_path: str
    tp_info: DistributedInfo
    dtype: torch.dtype
    max_running_req: int = 256
    attention_backend: str = "auto"
    cuda_graph_bs: List[int] | None = None
    cuda_graph_max_bs: int | None = None
    page_size: int = 1
    memory_ratio: float = 0.9
    distributed_timeout: float = 60.0
    use_dummy_weight: bool = False
    max_seq_len_override: int | None = None
    num_page_override: int | None = None

    @cached_property
    def hf_config(self) -> PretrainedConfig:
        if not os.path.isfile(os.path.join(self.model_path, "config.json")):  # 别让 AutoConfig 去连 hub
            raise FileNotFoundError(f"model_path={self.model_path!r}：找不到 config.json。下载真权重："
                                    f"hf download Qwen/Qwen3-0.6B --local-dir models/Qwen3-0.6B")
        return AutoConfig.from_pretrained(self.model_path)

    @cached_property
    def model_config(self) -> ModelConfig:
        return ModelConfig.from_hf(self.hf_config)

    @property
    def max_seq_len(self) -> int:
        return self.max_seq_len_override or self.model_config.rotary_config.max_position

    @property
    def max_forward_len(self) -> int:
        return self.max_seq_len
