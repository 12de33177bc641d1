"""纯 PyTorch 的注意力后端：其他后端都以它为参照。CPU 上用它，有 GPU 时它在 CUDA 上也能跑。

支持变长 batch（每个请求新 token 数不同）、分页 KV（按 page table 的槽位读历史）、前缀复用（cached_len > 0
的 prefill 接在已缓存的历史后面，因果掩码右下角对齐）和 GQA。和官方的 FlashInfer 后端一样把每个 token 当成
一页：page table 存的本来就是原始槽位，所以任何 page_size 都不用特殊处理。

decode 另有一条批量的快路：每个请求只有 1 个新 token，把各自的历史补齐成 (bs, 最长历史) 的矩形（补的位置遮掉），
每层一次整批的 scaled_dot_product_attention，不再按请求循环。算式和通用路径一样，只是多了一维 batch。
第 6 章起建后端时按 KV 池选一次：CPU 上的 fp32 池，decode 快路换成 minisgl/kernel 的 C++ 版（按槽位直接读池子）。
第 6 章起 decode 快路也能录成 CUDA 图：录图时各层读的是固定大小的静态缓冲（每行补到 page table 的宽度），
重放前 prepare_for_replay 把这一步的槽位和掩码拷进去（官方 FlashAttention 后端的 capture 数据也是这样）。
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Tuple

import torch
import torch.nn.functional as F

from minisgl.core import Batch, get_global_ctx
from minisgl.distributed import get_tp_info
from minisgl.kernel import cpu_op
from minisgl.utils import div_even

from .base import BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.models import ModelConfig


@dataclass
class TorchAttnMetadata(BaseAttnMetadata):
    cu_seqlens_q: torch.Tensor  # (padded_bs + 1,) int32：每个请求新 token 在这一步输入里的起止
    cu_seqlens_k: torch.Tensor  # (padded_bs + 1,) int32：每个请求全部历史在 indices 里的起止
    indices: torch.Tensor  # (Σ device_len,) int64：每个请求全部历史的 KV 槽位，首尾相接（int64 直接拿来索引）
    seqs: List[Tuple[int, int, int, int, int]]  # 每个请求 (q 起, q 止, k 起, k 止, cached_len)，切片用的 Python 整数
    decode_slots: torch.Tensor | None = None  # 只在 decode：(bs, L) int64，每行是一个请求的历史槽位，补齐到最长的 L
    decode_mask: torch.Tensor | None = None  # 只在 decode：(bs, 1, 1, L) bool，True = 真历史，False = 补的

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.cu_seqlens_q[1:1 + bs] - 1


@dataclass
class TorchCaptureData:
    """CUDA 图读的静态缓冲：每个录好的 bs 用前 bs 行。宽度是 page table 的宽度，所以任何长度的历史都放得下；
    代价是图里每步每个请求都按这个宽度取历史（补的位置遮掉），不按真实长度。"""
    cu_seqlens_q: torch.Tensor  # (max_bs + 1,) int32：decode 每个请求 1 个 token，永远是 0, 1, …, max_bs
    slots: torch.Tensor  # (max_bs, W) int64
    mask: torch.Tensor  # (max_bs, 1, 1, W) bool


def _cumsum(lengths: List[int]) -> List[int]:
    return [0, *itertools.accumulate(lengths)]


class TorchBackend(BaseAttnBackend):
    """纯 PyTorch 的注意力后端：按槽位从 KV 池取历史（prefill 逐个请求，decode 整批一次 SDPA）。
    构造时读 ctx.kv_cache。"""
    def __init__(self, config: ModelConfig) -> None:
        tp = get_tp_info().size
        self.kvcache = get_global_ctx().kv_cache  # 所以要先设好 ctx.kv_cache，再建后端
        self.num_qo_heads = div_even(config.num_qo_heads, tp)
        self.num_kv_heads = div_even(config.num_kv_heads, tp, allow_replicate=True)
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        self._decode_attention = cpu_op("decode_attention", self.kvcache.k_cache(0))
        self.capture: TorchCaptureData | None = None  # 录 CUDA 图时才建（init_capture_graph）

    def prepare_metadata(self, batch: Batch) -> None:
        ctx, reqs = get_global_ctx(), batch.padded_reqs
        page_table, device = ctx.page_table, ctx.page_table.device
        # 边界在主存里用 Python 整数算好再拷上设备：切片要用整数，而从设备读回来（.tolist()）在 GPU 上是一次同步
        q_bounds, k_bounds = _cumsum([r.extend_len for r in reqs]), _cumsum([r.device_len for r in reqs])
        batch.attn_metadata = meta = TorchAttnMetadata(
            cu_seqlens_q=torch.tensor(q_bounds, dtype=torch.int32, device=device),
            cu_seqlens_k=torch.tensor(k_bounds, dtype=torch.int32, device=device),
            indices=torch.cat([page_table[r.table_idx, :r.device_len] for r in reqs]).long(),  # 每个 batch 转一次
            seqs=[(q_bounds[i], q_bounds[i + 1], k_bounds[i], k_bounds[i + 1], r.cached_len)
                  for i, r in enumerate(reqs)],
        )
        if batch.is_decode and q_bounds[-1] == len(reqs):  # 每个请求正好 1 个新 token；每个 batch 准备一次，各层共用
            lens = [r.device_len for r in reqs]
            slots = page_table[torch.tensor([r.table_idx for r in reqs], device=device), :max(lens)]
            mask = torch.arange(slots.shape[1], device=device) < torch.tensor(lens, device=device)[:, None]
            # 补的位置指向自己的第 0 个槽位：它一定写过，读出的数有限；权重是 0，对结果没有贡献
            meta.decode_slots = torch.where(mask, slots, slots[:, :1]).long()
            meta.decode_mask = mask[:, None, None, :]

    def init_capture_graph(self, max_seq_len: int, bs_list: List[int]) -> None:
        """max_seq_len 是 page table 的宽度。第 0 列的掩码是 True：录图时的假请求也有一个能看的位置，不出 NaN。"""
        device, max_bs = self.kvcache.k_cache(0).device, max(bs_list)
        mask = torch.zeros((max_bs, 1, 1, max_seq_len), dtype=torch.bool, device=device)
        mask[..., 0] = True
        self.capture = TorchCaptureData(cu_seqlens_q=torch.arange(max_bs + 1, dtype=torch.int32, device=device),
                                        slots=torch.zeros((max_bs, max_seq_len), dtype=torch.int64, device=device),
                                        mask=mask)

    def prepare_for_capture(self, batch: Batch) -> None:
        """录 bs 个请求的图：元数据全是静态缓冲的前 bs 行（只有 decode 快路用得到的那几项）。"""
        bs, cap = batch.padded_size, self.capture
        batch.attn_metadata = TorchAttnMetadata(cu_seqlens_q=cap.cu_seqlens_q[:bs + 1], cu_seqlens_k=cap.cu_seqlens_q,
                                                indices=cap.slots[:0, 0], seqs=[], decode_slots=cap.slots[:bs],
                                                decode_mask=cap.mask[:bs])

    def prepare_for_replay(self, batch: Batch) -> None:
        """把 prepare_metadata 给这一步算好的槽位和掩码拷进静态缓冲（设备上拷，不同步）；右边补的列指向
        各行的第 0 个槽位、遮掉，和不录图时补的位置一样。"""
        meta, bs, cap = batch.attn_metadata, batch.padded_size, self.capture
        width = meta.decode_slots.shape[1]
        cap.slots[:bs, :width].copy_(meta.decode_slots)
        cap.slots[:bs, width:].copy_(meta.decode_slots[:, :1])  # 广播到右边的每一列
        cap.mask[:bs, ..., :width].copy_(meta.decode_mask)
        cap.mask[:bs, ..., width:].fill_(False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch) -> torch.Tensor:
        meta = batch.attn_metadata
        if not isinstance(meta, TorchAttnMetadata):  # 元数据由本后端的 prepare_metadata 建
            raise TypeError(f"TorchBackend 拿到的 attn_metadata 是 {type(meta).__name__}：先调 prepare_metadata(batch)")
        self.kvcache.store_kv(k, v, batch.out_loc, layer_id)  # 先写：新 token 也要看见自己
        kv_shape = (-1, self.num_kv_heads, self.head_dim)
        if meta.decode_slots is not None and self._decode_attention is not None:
            return self._decode_attention(q, self.kvcache.k_cache(layer_id).view(kv_shape),
                                          self.kvcache.v_cache(layer_id).view(kv_shape), meta.decode_slots,
                                          meta.decode_mask, self.scale)
        if meta.decode_slots is not None:
            slots = meta.decode_slots.view(-1)  # index_select 一次整块拷贝，比二维下标的高级索引快（每层两次）
            k_hist = self.kvcache.k_cache(layer_id).view(kv_shape).index_select(0, slots)
            v_hist = self.kvcache.v_cache(layer_id).view(kv_shape).index_select(0, slots)
            bs_l = (*meta.decode_slots.shape, self.num_kv_heads, self.head_dim)
            return self._decode(q, k_hist.view(bs_l), v_hist.view(bs_l), meta.decode_mask)
        k_all = self.kvcache.k_cache(layer_id).view(kv_shape)[meta.indices]  # 一次取出整个 batch 的历史
        v_all = self.kvcache.v_cache(layer_id).view(kv_shape)[meta.indices]
        out = torch.empty_like(q)
        for q0, q1, k0, k1, cached_len in meta.seqs:
            out[q0:q1] = self._attend(q[q0:q1], k_all[k0:k1], v_all[k0:k1], cached_len)
        return out

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cached_len: int) -> torch.Tensor:
        """一个请求。q: (n_q, H_q, D) 是位置 [cached_len, cached_len + n_q)；k, v: (n_k, H_kv, D) 是位置 [0, n_k)。"""
        groups = self.num_qo_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # GQA：kv 头复制给 q 头
        s = torch.einsum("qhd,khd->hqk", q, k) * self.scale
        q_pos = torch.arange(cached_len, cached_len + q.shape[0], device=q.device)
        future = torch.arange(k.shape[0], device=q.device)[None, :] > q_pos[:, None]  # 右下角对齐的因果掩码
        s = s.masked_fill(future, float("-inf"))
        return torch.einsum("hqk,khd->qhd", s.softmax(-1, dtype=torch.float32).to(v.dtype), v)

    def _decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """整个 batch 一起。q: (bs, H_q, D) 每个请求 1 个新 token；k, v: (bs, L, H_kv, D)；mask: (bs, 1, 1, L)。
        算式和 _attend 一样：softmax(q·kᵀ·scale，补的位置遮掉)·v。整批交给 F.scaled_dot_product_attention 一次算完：
        每层一个算子，而不是十来个小算子（decode 每步每层都要付一次调度开销）。enable_gqa：同一组的 q 头共用一个 kv 头，
        不复制 kv。"""
        bs = q.shape[0]
        o = F.scaled_dot_product_attention(q.reshape(bs, self.num_qo_heads, 1, self.head_dim),  # (bs, H_q, 1, D)
                                           k.transpose(1, 2), v.transpose(1, 2),  # (bs, H_kv, L, D)
                                           attn_mask=mask, scale=self.scale, enable_gqa=True)
        return o.reshape(bs, self.num_qo_heads, self.head_dim)
