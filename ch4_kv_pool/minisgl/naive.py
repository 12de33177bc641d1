"""还没有被换掉的朴素部件：einsum 加显式掩码的注意力。

KV 已经换成了预分配的池（第 4 章）：先把这一步新 token 的 K/V 写进它们的槽位（out_loc），
再按 page table 把每个请求的全部历史读出来算注意力。第 5 章把这里换成可插拔的注意力后端。
"""

from __future__ import annotations

import torch

from minisgl.core import get_global_ctx


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int) -> torch.Tensor:
    """q: (N, H_q, D)，k/v: (N, H_kv, D)，N 是这个 batch 所有请求新 token 的总数；返回 (N, H_q, D)。"""
    ctx = get_global_ctx()
    ctx.kv_cache.store_kv(k, v, ctx.batch.out_loc, layer_id)  # 先写：新 token 也要看见自己
    k_pool = ctx.kv_cache.k_cache(layer_id).view(-1, k.shape[1], k.shape[2])  # (槽位数, H_kv, D)
    v_pool = ctx.kv_cache.v_cache(layer_id).view(-1, v.shape[1], v.shape[2])
    outs, start = [], 0
    for req in ctx.batch.reqs:
        end = start + req.extend_len
        slots = ctx.page_table[req.table_idx, :req.device_len].long()  # 这个请求每个位置的槽位
        outs.append(_attend(q[start:end], k_pool[slots], v_pool[slots], req.cached_len))
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
