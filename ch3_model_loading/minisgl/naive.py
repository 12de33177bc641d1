"""还没有被换掉的朴素部件：每个请求每层一个用 torch.cat 变长的 KV 列表，einsum 加显式掩码的注意力。

和第 0 步相比唯一的变化是"多个请求"：KV 按请求的 table_idx 分开存，注意力逐个请求算。
第 4 章把 KV 换成预分配的池，第 5 章把注意力换成可插拔的后端。
"""

from __future__ import annotations

import torch

from minisgl.core import Req, get_global_ctx


class NaiveKVCache:
    """table_idx -> 每层一个 (K, V)，形状 (已缓存的 token 数, kv 头数, head_dim)。"""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self._kv: dict[int, list[tuple[torch.Tensor, torch.Tensor] | None]] = {}

    def append(self, req: Req, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """接上这次的新 K/V，返回这个请求的全部 K/V。每一步都把整段历史复制一遍——这正是第 4 章要消灭的。"""
        layers = self._kv.setdefault(req.table_idx, [None] * self.num_layers)
        old = layers[layer_id]
        cached = 0 if old is None else old[0].shape[0]
        if cached != req.cached_len:
            raise RuntimeError(f"{req}: 第 {layer_id} 层缓存了 {cached} 个 token 的 KV，与 cached_len 不符")
        if old is not None:
            k, v = torch.cat([old[0], k]), torch.cat([old[1], v])
        layers[layer_id] = (k, v)
        return k, v


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
    """q: (N, H_q, D)，k/v: (N, H_kv, D)，N 是这个 batch 所有请求新 token 的总数；返回 (N, H_q, D)。"""
    ctx = get_global_ctx()
    outs, start = [], 0
    for req in ctx.batch.reqs:
        end = start + req.extend_len
        k_all, v_all = ctx.kv_cache.append(req, layer_id, k[start:end], v[start:end])
        outs.append(_attend(q[start:end], k_all, v_all, req.cached_len))
        start = end
    return torch.cat(outs)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cached_len: int) -> torch.Tensor:
    """一个请求：q 是位置 [cached_len, cached_len + len(q)) 的查询，k/v 是位置 [0, len(k)) 的全部历史。"""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # GQA
    s = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    pos = torch.arange(cached_len, cached_len + q.shape[0])
    s = s.masked_fill(torch.arange(k.shape[0])[None, :] > pos[:, None], float("-inf"))  # 不看未来
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
