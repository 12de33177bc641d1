"""注意力后端的接口：元数据每个 batch 准备一次，各层的 forward 共用。"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import List

import torch

from minisgl.core import Batch


@dataclass
class BaseAttnMetadata(ABC):
    @abstractmethod
    def get_last_indices(self, bs: int) -> torch.Tensor:
        """前 bs 个请求各自最后一个 token 在这一步输入里的行号：prefill 时只有这些行进 LM head。"""


class BaseAttnBackend(ABC):
    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        """q: (N, H_q, D)；k, v: (N, H_kv·D)。先把新 token 的 K/V 写进池，再算注意力，返回 (N, H_q, D)。"""

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """读 batch.padded_reqs 和 ctx.page_table，设置 batch.attn_metadata。"""

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        raise NotImplementedError(f"{type(self).__name__} 不支持 CUDA 图")

    def prepare_for_capture(self, batch: Batch) -> None:
        raise NotImplementedError(f"{type(self).__name__} 不支持 CUDA 图")

    def prepare_for_replay(self, batch: Batch) -> None:
        raise NotImplementedError(f"{type(self).__name__} 不支持 CUDA 图")


class HybridBackend(BaseAttnBackend):
    """prefill 和 decode 各用一个后端；CUDA 图只用于 decode。官方 API 的占位：阶段一只有 torch 一个能用的后端。"""

    def __init__(self, prefill_backend: BaseAttnBackend, decode_backend: BaseAttnBackend) -> None:
        self.prefill_backend, self.decode_backend = prefill_backend, decode_backend

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        backend = self.prefill_backend if batch.is_prefill else self.decode_backend
        return backend.forward(q, k, v, layer_id, batch)

    def prepare_metadata(self, batch: Batch) -> None:
        (self.prefill_backend if batch.is_prefill else self.decode_backend).prepare_metadata(batch)

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        self.decode_backend.init_capture_graph(max_seq_len, bs_list)

    def prepare_for_capture(self, batch: Batch) -> None:
        self.decode_backend.prepare_for_capture(batch)

    def prepare_for_replay(self, batch: Batch) -> None:
        self.decode_backend.prepare_for_replay(batch)
