"""GraphRunner：官方在 GPU 上把 decode 的前向录成 CUDA 图，把 batch 补齐到录好的大小再重放。

CUDA 图要求注意力后端支持 prepare_for_capture / prepare_for_replay；阶段一只有纯 PyTorch 的后端，它不支持，
所以这里的图总是关着的（CPU 上本来也没有 CUDA 图）。接口保持和官方一致：pad_batch 照常设置
padded_reqs，阶段二的调度器代码可以一行一行地对上。
"""

from __future__ import annotations

from typing import List

import torch

from minisgl.attention import BaseAttnBackend, TorchBackend
from minisgl.core import Batch, Req


class GraphRunner:
    """CUDA 图的录制和重放。阶段一没有能录图的后端：pad_batch 不补假请求，replay 不会被调用。"""
    def __init__(self, device: torch.device, attn_backend: BaseAttnBackend, cuda_graph_bs: List[int] | None,
                 cuda_graph_max_bs: int | None, dummy_req: Req) -> None:
        self.dummy_req = dummy_req
        self.graph_bs_list = self._determine_cuda_graph_bs(device, attn_backend, cuda_graph_bs, cuda_graph_max_bs)
        self.max_graph_bs = max(self.graph_bs_list, default=0)

    @staticmethod
    def _determine_cuda_graph_bs(device: torch.device, attn_backend: BaseAttnBackend, cuda_graph_bs: List[int] | None,
                                 cuda_graph_max_bs: int | None) -> List[int]:
        if device.type != "cuda" or isinstance(attn_backend, TorchBackend):
            return []
        if cuda_graph_bs == [] or cuda_graph_max_bs == 0:  # 和官方一样，这两种写法都表示关掉 CUDA 图
            return []
        raise NotImplementedError("阶段一没有支持 CUDA 图的注意力后端；请把 cuda_graph_bs 设成 []"
                                  "（或 cuda_graph_max_bs 设成 0）")

    def can_use_cuda_graph(self, batch: Batch) -> bool:
        """decode，且真请求数不超过录好的最大 bs。"""
        return batch.is_decode and batch.size <= self.max_graph_bs

    def pad_batch(self, batch: Batch) -> None:
        """用假请求把 batch 补齐到录好的某个大小；图关着时 padded_reqs 就是 reqs。"""
        padded_size = batch.size
        if self.can_use_cuda_graph(batch):
            padded_size = next(bs for bs in sorted(self.graph_bs_list) if bs >= batch.size)
        batch.padded_reqs = batch.reqs + [self.dummy_req] * (padded_size - batch.size)

    def replay(self, batch: Batch) -> torch.Tensor:
        """重放录好的图；阶段一没有图，调到它就是 RuntimeError。"""
        raise RuntimeError("没有录好的 CUDA 图")

    def destroy_cuda_graphs(self) -> None:
        pass
