"""decode 一步里矩阵乘之外的小算子：CPU 上的 fp32 走 csrc/decode_ops.cpp，一个算子一次调用；其余走 PyTorch。

每个函数的退路就是前几章的算式（F.rms_norm、查表旋转、按槽位赋值、SDPA、F.silu），签名和它们在 layers / kvcache /
attention 里的调用一样。C++ 版只是少付调度开销：PyTorch 里一个 RMSNorm 是五六个 ATen 算子，decode 每步每层要做好几次，
每个算子都要分配输出、调度一次、把刚被权重挤出缓存的数据再读一遍（附录"CPU 上的矩阵乘"有实测）。
官方在 GPU 上用 flashinfer 的 rmsnorm / fused_add_rmsnorm / apply_rope_with_cos_sin_cache_inplace / silu_and_mul、
自己的 store_cache 内核和 FlashInfer 的 decode 注意力做同样的事。
"""

from __future__ import annotations

from types import ModuleType
from typing import Tuple

import torch
import torch.nn.functional as F

from . import cpu_linear  # 和线性层共用一个扩展、一个开关：cpu_linear.extension() 返回 None 时这里也全走 PyTorch


def _ext(*tensors: torch.Tensor) -> ModuleType | None:
    """C++ 版只收 CPU 上的 fp32：是就返回编好的扩展，别的设备、别的 dtype（或扩展用不了）返回 None，走 PyTorch。
    每层要查好几次，写成普通的循环（比 all(生成器) 省一半时间）。"""
    for t in tensors:
        if not t.is_cpu or t.dtype != torch.float32:
            return None
    return cpu_linear.extension()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: (..., d) -> 同形状：x·rsqrt(mean(x²) + eps)·weight。
    计算顺序和 HF 一样：在 fp32 里归一化，转回 x 的 dtype，再乘 weight（bf16 下才和 HF 逐位相同）。"""
    if (ext := _ext(x, weight)) is not None:
        return ext.rms_norm(x, weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """返回 (rms_norm(x + residual), x + residual)，不改输入。"""
    if (ext := _ext(x, residual, weight)) is not None:
        return ext.add_rms_norm(x, residual, weight, eps)
    x = x + residual
    return rms_norm(x, weight, eps), x


def apply_rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
               head_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """query (N, H_q·D)、key (N, H_kv·D)（或拆成头的三维）-> 旋转后的新张量，形状不变。
    cos_sin_cache (max_pos, 2D)：每行 [cos, cos, -sin, sin]（layers/rotary.py 建的表）。"""
    if (ext := _ext(query, key, cos_sin_cache)) is not None:
        return ext.apply_rope(positions, query, key, cos_sin_cache, head_size)
    cos, sin = cos_sin_cache.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)  # 各 (N, 1, D)

    def rotate(x: torch.Tensor) -> torch.Tensor:  # HF 的 x·cos + rotate_half(x)·sin；负号已经在表里的 sin 上
        xf = x.reshape(x.shape[0], -1, head_size).float()
        return (xf * cos + xf.roll(head_size // 2, dims=-1) * sin).to(x.dtype).reshape(x.shape)

    return rotate(query), rotate(key)


def store_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor) -> None:
    """k_cache / v_cache (槽位数, H_kv, D)：第 i 个 token 的 k、v 写进槽位 indices[i]，别的槽位不动。参数顺序同官方。"""
    if (ext := _ext(k_cache, v_cache, k, v)) is not None:
        return ext.store_cache(k_cache, v_cache, indices, k, v)
    loc = indices.long()
    k_cache[loc] = k.reshape(-1, *k_cache.shape[1:])
    v_cache[loc] = v.reshape(-1, *v_cache.shape[1:])


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                     mask: torch.Tensor, scale: float) -> torch.Tensor:
    """每个请求 1 个新 token。q: (bs, H_q, D)；k_cache / v_cache (槽位数, H_kv, D)；slots (bs, L) int64 历史槽位；
    mask (bs, 1, 1, L) bool，True = 真历史 -> (bs, H_q, D)。C++ 版按槽位直接读池子；PyTorch 版先拷出 (bs, L) 的矩形，
    再整批交给 scaled_dot_product_attention（enable_gqa：同一组的 q 头共用一个 kv 头）。"""
    if (ext := _ext(q, k_cache, v_cache)) is not None:
        return ext.decode_attention(q, k_cache, v_cache, slots, mask, scale)
    bs, h_q, d = q.shape
    k = k_cache.index_select(0, slots.view(-1)).view(*slots.shape, -1, d)  # (bs, L, H_kv, D)
    v = v_cache.index_select(0, slots.view(-1)).view(*slots.shape, -1, d)
    o = F.scaled_dot_product_attention(q.reshape(bs, h_q, 1, d), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, scale=scale, enable_gqa=True)
    return o.reshape(bs, h_q, d)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """门控激活：x (N, 2I) 的前一半过 SiLU，乘以后一半 -> (N, I)。"""
    if (ext := _ext(x)) is not None:
        return ext.silu_and_mul(x)
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
