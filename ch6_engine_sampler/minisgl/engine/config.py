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
    满长序列用得到的页数。distributed_addr 官方是固定的属性；这里是字段，测试可以各用各的端口。"""

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
    distributed_addr: str = "tcp://127.0.0.1:2333"
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

    # --8<-- [start:check_tp]
    def check_tp(self) -> None:
        """按 tp_info.size 切得开这个模型吗？切不开就说出是哪一项。词表不必整除：最后一份补 0（第 2 章）。"""
        tp, mc = self.tp_info.size, self.model_config
        bad = [f"num_attention_heads={mc.num_qo_heads}"] if mc.num_qo_heads % tp else []
        if (mc.num_kv_heads % tp if tp <= mc.num_kv_heads else tp % mc.num_kv_heads):
            bad.append(f"num_key_value_heads={mc.num_kv_heads}（比 tp 少时 tp 须是它的整数倍，才能复制）")
        if mc.intermediate_size % tp:
            bad.append(f"intermediate_size={mc.intermediate_size}")
        if bad:
            raise ValueError(f"tp={tp} 切不开 {self.model_path}：{'、'.join(bad)} 不能平均分成 {tp} 份")
    # --8<-- [end:check_tp]
