"""批量采样：贪心走 argmax 的快路；温度、top-k、top-p 按请求各设各的，整个 batch 一次采完。

先按温度做 softmax，再截 top-k，再截 top-p（在 top-k 之后重新归一化的分布上取最小的、概率和达到 p 的那一组），
最后 multinomial。logits 里有 NaN 的请求得到 token -1（NAN_TOKEN）：不在这里同步查，调用方读 token 时顺带发现。
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from minisgl.core import Batch


@dataclass
class BatchSamplingArgs:
    temperatures: torch.Tensor | None  # None：整个 batch 都是贪心
    top_k: torch.Tensor | None = None  # (bs,) int32；None：没有请求截 top-k
    top_p: torch.Tensor | None = None  # (bs,) float32；None：没有请求截 top-p
    greedy: torch.Tensor | None = None  # (bs,) bool：混合 batch 里贪心的请求，精确取 argmax


NAN_TOKEN = -1  # logits 里有 NaN 时的 token：不是词表里的 id，调用方一看就知道这一步算坏了


def make_device_tensor(data: List, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """官方 API 的占位（官方在 GPU 上经 pinned memory 异步拷贝）；这里就是 torch.tensor。"""
    return torch.tensor(data, dtype=dtype, device=device)


@dataclass
class Sampler:
    device: torch.device
    vocab_size: int

    def prepare(self, batch: Batch) -> BatchSamplingArgs:
        """把 batch 里每个请求的采样参数排成张量；全是贪心时 temperatures=None（直接 argmax）。"""
        params = [r.sampling_params for r in batch.reqs]
        if all(p.is_greedy for p in params):
            return BatchSamplingArgs(temperatures=None)
        ts = [max(0.0 if p.is_greedy else p.temperature, 1e-6) for p in params]
        top_ks = [p.top_k if p.top_k >= 1 else self.vocab_size for p in params]
        top_ps = [min(max(p.top_p, 1e-6), 1.0) for p in params]
        return BatchSamplingArgs(
            temperatures=make_device_tensor(ts, torch.float32, self.device),
            top_k=make_device_tensor(top_ks, torch.int32, self.device) if any(k != self.vocab_size for k in top_ks)
            else None,
            top_p=make_device_tensor(top_ps, torch.float32, self.device) if any(p < 1.0 for p in top_ps) else None,
            greedy=make_device_tensor([p.is_greedy for p in params], torch.bool, self.device),
        )

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """logits: (bs, vocab) -> (bs,) token id；有 NaN 的行是 NAN_TOKEN（一次归约，不同步）。"""
        nan_rows = logits.isnan().any(dim=-1)
        if args.temperatures is None:
            tokens = torch.argmax(logits, dim=-1)
        else:
            clean = logits.float().nan_to_num(nan=0.0)  # 坏行照常抽一个（multinomial 不收 NaN），反正会被换掉
            tokens = sample_impl(clean, args.temperatures, args.top_k, args.top_p)
            tokens = tokens if args.greedy is None else torch.where(args.greedy, logits.argmax(dim=-1), tokens)
        return torch.where(nan_rows, NAN_TOKEN, tokens)


def sample_impl(logits: torch.Tensor, temperatures: torch.Tensor, top_k: torch.Tensor | None,
                top_p: torch.Tensor | None) -> torch.Tensor:
    """非贪心的一批：softmax(logits / T) → 截 top-k → 重新归一化 → 截 top-p → multinomial，返回 (bs,) token id。"""
    probs = torch.softmax(logits / temperatures[:, None], dim=-1)
    if top_k is None and top_p is None:
        return torch.multinomial(probs, 1).squeeze(1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # 每行从大到小，截断都在排好序的一侧做
    rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    if top_k is not None:
        sorted_probs = sorted_probs.masked_fill(rank >= top_k[:, None], 0.0)
    if top_p is not None:
        sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # 排在它前面的概率和
        sorted_probs = sorted_probs.masked_fill((before >= top_p[:, None]) & (rank > 0), 0.0)
    choice = torch.multinomial(sorted_probs, 1)  # multinomial 自己会归一化
    return order.gather(1, choice).squeeze(1)
