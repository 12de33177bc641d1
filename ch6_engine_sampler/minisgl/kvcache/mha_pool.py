"""预分配的 KV 池：一次分好 (2, 层数, 页数, page_size, kv 头数, head_dim)，之后只往里写新 token。

第 0 步每一步都 torch.cat 把整段历史复制一遍；这里每个新 token 只写自己的槽位（out_loc），
历史原地不动，由 page table 记着每个请求的每个位置在哪个槽位。第 6 章起建池时选一次写法：CPU 上的 fp32 池
换成 minisgl/kernel 的 C++ store_cache（一次调用写完 K 和 V，官方也调它自己的 store_cache 内核）。
"""

from __future__ import annotations

import torch

from minisgl.distributed import get_tp_info
from minisgl.kernel import cpu_op
from minisgl.utils import div_even

from .base import BaseKVCachePool


class MHAKVCache(BaseKVCachePool):
    """num_kv_heads 是整个模型的 KV 头数：池自己按 get_tp_info().size 切出本 rank 的 local_kv_heads
    （所以要先 set_tp_info）。"""
    def __init__(self, num_kv_heads: int, num_layers: int, head_dim: int, num_pages: int, page_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        sizes = dict(num_kv_heads=num_kv_heads, num_layers=num_layers, head_dim=head_dim, num_pages=num_pages,
                     page_size=page_size)
        bad = {k: v for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:  # 在这里拒绝：否则是一个空的池，或者 torch.zeros 报一个看不出是哪个参数的错
            raise ValueError(f"MHAKVCache: {bad} 都必须是正整数")
        self.local_kv_heads = div_even(num_kv_heads, get_tp_info().size, allow_replicate=True)
        self.num_pages = num_pages
        self.page_size = page_size
        self.head_dim = head_dim
        # 先清零：否则操作系统按需分配内存，每个新槽位第一次写入都要缺一次页，这笔开销会落在 decode 的热路径上
        self._kv_buffer = torch.zeros((2, num_layers, num_pages, page_size, self.local_kv_heads, head_dim),
                                      dtype=dtype, device=device)
        self._k_buffer, self._v_buffer = self._kv_buffer[0], self._kv_buffer[1]
        self._storage_shape = (num_pages * page_size, self.local_kv_heads, head_dim)
        self._store_cache = cpu_op("store_cache", self._kv_buffer)

    def k_cache(self, index: int) -> torch.Tensor:
        """第 index 层的 K，分页的视图：(num_pages, page_size, H_kv, D)。"""
        return self._k_buffer[index]

    def v_cache(self, index: int) -> torch.Tensor:
        """第 index 层的 V，分页的视图：(num_pages, page_size, H_kv, D)。"""
        return self._v_buffer[index]

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int) -> None:
        """k, v: (N, H_kv·D) 或 (N, H_kv, D)；out_loc: (N,) 槽位。只写这 N 个槽位，不碰别的。"""
        if self._store_cache is not None:
            return self._store_cache(self._k_buffer[layer_id].view(self._storage_shape),
                                     self._v_buffer[layer_id].view(self._storage_shape), out_loc, k, v)
        loc = out_loc.long()
        self._k_buffer[layer_id].view(self._storage_shape)[loc] = k.reshape(-1, *self._storage_shape[1:])
        self._v_buffer[layer_id].view(self._storage_shape)[loc] = v.reshape(-1, *self._storage_shape[1:])

    @property
    def device(self) -> torch.device:
        """池所在的设备。"""
        return self._kv_buffer.device

    @property
    def dtype(self) -> torch.dtype:
        """池里 K/V 的 dtype。"""
        return self._kv_buffer.dtype

    @property
    def num_layers(self) -> int:
        """层数（池的第二维）。"""
        return self._kv_buffer.shape[1]
