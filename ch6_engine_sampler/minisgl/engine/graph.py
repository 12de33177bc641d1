"""GraphRunner：GPU 上把 decode 的前向录成 CUDA 图，之后每步把 batch 补齐到录好的大小、重放。

一次前向是几百个 kernel，decode 时每个都很小：CPU 发射它们的时间比 GPU 算它们还长。CUDA 图把整段前向录下来，
重放时一次提交。录下来的是"哪个 kernel、读写哪块显存、带哪些数"：形状和 Python 里的数在录的那一刻就定死了。
所以图只读静态缓冲（GraphCaptureBuffer 和注意力后端的 capture 数据），重放前把这一步的数拷进去；
图里不能有读回主存的操作（录图时 CUDA 直接报错）。CPU 上没有 CUDA 图：图总是关着，pad_batch 不补。
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List

import torch

from minisgl.core import Batch, Req, get_global_ctx

if TYPE_CHECKING:
    from minisgl.attention import BaseAttnBackend
    from minisgl.models import BaseLLMModel


@dataclass
class GraphCaptureBuffer:
    """图读写的输入输出：按最大的 bs 分配一次，各个图用前 bs 行。"""
    input_ids: torch.Tensor  # (max_bs,) int32
    out_loc: torch.Tensor  # (max_bs,) int32
    positions: torch.Tensor  # (max_bs,) int32
    logits: torch.Tensor  # (max_bs, V) float32

    @classmethod
    def init(cls, bs: int, vocab_size: int, device: torch.device) -> GraphCaptureBuffer:
        """按最大的 bs 建一次：三个输入 (bs,) int32 全是 0，logits (bs, vocab_size) float32 不初始化（图会写满它）。"""
        return GraphCaptureBuffer(input_ids=torch.zeros(bs, dtype=torch.int32, device=device),
                                  out_loc=torch.zeros(bs, dtype=torch.int32, device=device),
                                  positions=torch.zeros(bs, dtype=torch.int32, device=device),
                                  logits=torch.empty(bs, vocab_size, dtype=torch.float32, device=device))

    def set_batch(self, batch: Batch) -> None:
        """录图时：batch 的三个输入就是缓冲的前 padded_size 行，图里的各层读的是它们。"""
        rows = slice(batch.padded_size)
        batch.input_ids, batch.out_loc, batch.positions = self.input_ids[rows], self.out_loc[rows], self.positions[rows]

    def copy_from(self, batch: Batch) -> None:
        """重放前：把这一步的输入拷进缓冲（设备上拷，不同步）。"""
        rows = slice(batch.padded_size)
        self.input_ids[rows] = batch.input_ids
        self.out_loc[rows] = batch.out_loc
        self.positions[rows] = batch.positions


def _determine_cuda_graph_bs(device: torch.device, cuda_graph_bs: List[int] | None, cuda_graph_max_bs: int | None,
                             max_running_req: int) -> List[int]:
    """给了 cuda_graph_bs 就用它（[] 表示关掉）；否则和官方一样是 1, 2, 4, 8, 16, 24, …，到 cuda_graph_max_bs
    （默认 160）为止，并且录到第一个 >= max_running_req 的大小就停：一个 batch 最多 max_running_req 个请求，
    再大的图用不上。cuda_graph_max_bs 不在这串数上时只是上限，自己不加进去（10 → 1, 2, 4, 8，和官方一样）。
    CPU 上没有 CUDA 图，总是 []。"""
    if cuda_graph_bs is not None and any(bs < 1 for bs in cuda_graph_bs):
        raise ValueError(f"EngineConfig.cuda_graph_bs={cuda_graph_bs}：每个大小都要 >= 1（[] 表示不录图）")
    if device.type != "cuda":
        return []
    if cuda_graph_bs is not None:
        return sorted(set(cuda_graph_bs))
    max_bs = 160 if cuda_graph_max_bs is None else cuda_graph_max_bs
    if max_bs < 1:
        return []
    sizes = [bs for bs in [1, 2, 4, *range(8, max_bs + 1, 8)] if bs <= max_bs]
    return [bs for i, bs in enumerate(sizes) if i == 0 or sizes[i - 1] < max_running_req]


class GraphRunner:
    """decode 的 CUDA 图：构造时按 bs 从大到小各录一张（共用一个显存池），forward_batch 里能用就重放。"""
    def __init__(self, device: torch.device, model: BaseLLMModel, attn_backend: BaseAttnBackend,
                 cuda_graph_bs: List[int] | None, cuda_graph_max_bs: int | None, max_seq_len: int, vocab_size: int,
                 dummy_req: Req) -> None:
        # 假请求占 page table 的最后一行，它的行号就是 max_running_req
        self.graph_bs_list = _determine_cuda_graph_bs(device, cuda_graph_bs, cuda_graph_max_bs, dummy_req.table_idx)
        self.max_graph_bs = max(self.graph_bs_list, default=0)
        self.attn_backend = attn_backend
        self.dummy_req = dummy_req
        self.device = device
        self.graph_map: Dict[int, torch.cuda.CUDAGraph] = {}
        self._capture_graphs(max_seq_len, vocab_size, model)

    def _capture_graphs(self, max_seq_len: int, vocab_size: int, model: BaseLLMModel) -> None:
        """图关着时什么也不做（不碰 CUDA）。每张图录之前先照常跑一遍：第一次前向里的惰性初始化不进图。
        预热和录图共用一个 forward_batch（同一个 batch、同一份静态缓冲），和官方一样；分成两个也行，结果相同。"""
        if self.max_graph_bs == 0:
            return
        self.attn_backend.init_capture_graph(max_seq_len, self.graph_bs_list)
        self.buffer = GraphCaptureBuffer.init(self.max_graph_bs, vocab_size, self.device)
        pool = None
        for bs in sorted(self.graph_bs_list, reverse=True):  # 先录最大的：之后的图在它的显存池里分配
            graph = torch.cuda.CUDAGraph()
            batch = Batch(reqs=[self.dummy_req] * bs, phase="decode")
            batch.padded_reqs = batch.reqs
            self.attn_backend.prepare_for_capture(batch)
            self.buffer.set_batch(batch)
            with get_global_ctx().forward_batch(batch):
                self.buffer.logits[:bs] = model.forward()
                with torch.cuda.graph(graph, pool=pool):
                    self.buffer.logits[:bs] = model.forward()
            if pool is None:
                pool = graph.pool()
            self.graph_map[bs] = graph

    def can_use_cuda_graph(self, batch: Batch) -> bool:
        """decode，且真请求数不超过录好的最大 bs。"""
        return batch.is_decode and batch.size <= self.max_graph_bs

    def pad_batch(self, batch: Batch) -> None:
        """用假请求把 batch 补齐到录好的某个大小（第一个装得下的）；用不上图时不补（padded_reqs 和 reqs 内容相同）。"""
        padded_size = batch.size
        if self.can_use_cuda_graph(batch):
            padded_size = next(bs for bs in self.graph_bs_list if bs >= batch.size)
        batch.padded_reqs = batch.reqs + [self.dummy_req] * (padded_size - batch.size)

    def replay(self, batch: Batch) -> torch.Tensor:
        """输入拷进缓冲、注意力的元数据拷进后端的静态缓冲、重放 padded_size 那张图；返回真请求的 logits。"""
        if batch.padded_size not in self.graph_map:
            raise ValueError(f"decode 的 batch 有 {batch.padded_size} 个请求（含假请求），没有这个大小的 CUDA 图"
                             f"（录好的：{self.graph_bs_list}）：前向之前先调 graph_runner.pad_batch(batch)")
        self.buffer.copy_from(batch)
        self.attn_backend.prepare_for_replay(batch)
        self.graph_map[batch.padded_size].replay()
        return self.buffer.logits[:batch.size]

    def destroy_cuda_graphs(self) -> None:
        """释放图和它们的显存池（TP 时要在拆进程组之前）：清空 graph_map、gc.collect()，别处不留图的引用。
        静态缓冲（buffer、后端的 capture 数据）是普通张量，不在图的池子里，留着随 GraphRunner 一起回收，和官方一样。"""
        self.graph_map.clear()
        gc.collect()
