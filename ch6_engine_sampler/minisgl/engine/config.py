from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import List

import torch
from transformers import PretrainedConfig

from minisgl.distributed import DistributedInfo
from minisgl.models import ModelConfig, load_hf_config


@dataclass(frozen=True)
class EngineConfig:
    """CPU 上 num_page_override 不给时按可用内存估算，但不会超过 max_running_req 条满长序列用得到的页数。
    distributed_addr 是字段：测试可以各用各的端口。device 是官方没有的字段："auto" 有 GPU 就用 cuda:{rank}；
    "cpu" 在 GPU 机器上也放 CPU（只有一块卡时，TP 的几个 rank 就这样在 CPU 上用 gloo 跑）。"""

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
    device: str = "auto"

    def __post_init__(self) -> None:
        """配置本身就不可能工作时，构造时就报错：别等到加载完权重、建 KV 池或注意力后端时才发现。"""
        for name in ("page_size", "max_running_req", "num_page_override", "max_seq_len_override"):
            value = getattr(self, name)
            if value is None and name.endswith("override"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EngineConfig.{name}={value!r}：必须是正整数")
        if self.num_page_override is not None and self.num_page_override < self.max_running_req:
            raise ValueError(f"EngineConfig.num_page_override={self.num_page_override}（--num-pages）页的 KV 池太小："
                             f"max_running_req={self.max_running_req} 个请求每个至少要一页")
        if not 0.0 < self.memory_ratio <= 1.0:
            raise ValueError(f"EngineConfig.memory_ratio={self.memory_ratio!r}：应当在 (0, 1] 里")
        if not self.distributed_timeout > 0:  # 也挡住 NaN
            raise ValueError(f"EngineConfig.distributed_timeout={self.distributed_timeout!r}：必须是正的秒数")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"EngineConfig.device={self.device!r}：只能是 'auto'、'cpu' 或 'cuda'")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("EngineConfig.device='cuda'：这台机器上的 torch 看不到 GPU")

    @cached_property
    def hf_config(self) -> PretrainedConfig:
        """load_hf_config(model_path)，缓存；目录、config.json 哪里不对就说哪里。"""
        return load_hf_config(self.model_path)  # 目录、config.json、结构、必需字段：哪里不对说哪里

    @cached_property
    def model_config(self) -> ModelConfig:
        """ModelConfig.from_hf(hf_config)，缓存：整个模型的头数、层数（check_tp 读它）。"""
        return ModelConfig.from_hf(self.hf_config)

    @property
    def rank_device(self) -> torch.device:
        """本 rank 的设备：Engine 用它，launch_tp 也问它（各 rank 要不要一块自己的卡）。"""
        if self.device == "cpu" or not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device(f"cuda:{self.tp_info.rank}")

    @property
    def max_seq_len(self) -> int:
        """max_seq_len_override，没给时取模型的 max_position_embeddings。"""
        return self.max_seq_len_override or self.model_config.rotary_config.max_position

    # --8<-- [start:check_tp]
    def check_tp(self) -> None:
        """按 tp_info.size 切得开这个模型吗？切不开就在一条 ValueError 里说出切不开的每一项（不只第一项）。
        读 self.model_config（num_qo_heads、num_kv_heads、intermediate_size），报错用 HF 的字段名。
        词表不必整除：最后一份补 0（第 2 章）。"""
        tp, mc = self.tp_info.size, self.model_config
        bad = [f"num_attention_heads={mc.num_qo_heads}"] if mc.num_qo_heads % tp else []
        if (mc.num_kv_heads % tp if tp <= mc.num_kv_heads else tp % mc.num_kv_heads):
            bad.append(f"num_key_value_heads={mc.num_kv_heads}（比 tp 少时 tp 须是它的整数倍，才能复制）")
        if mc.intermediate_size % tp:
            bad.append(f"intermediate_size={mc.intermediate_size}")
        if bad:
            raise ValueError(f"tp={tp} 切不开 {self.model_path}：{'、'.join(bad)} 不能平均分成 {tp} 份")
    # --8<-- [end:check_tp]
