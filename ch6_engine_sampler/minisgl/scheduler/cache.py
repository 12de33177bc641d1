from __future__ import annotations

from typing import Dict, List

import torch

from minisgl.core import Req
from minisgl.utils import div_ceil


class CacheManager:
    """空闲的 KV 页，以及把页写进 page table 的 allocate_paged。没有前缀缓存（阶段二）。

    页的账记在主存里（Python 整数）：哪一行依次拿到了哪些页。同一页不会同时给两行，
    所以 out_loc 不会重复——这一点在这里保证，引擎不必每步去设备上查。"""

    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.page_table = page_table
        self.free_slots: List[int] = [p * page_size for p in range(num_pages)]  # 每个空闲页的首槽位
        self._row_pages: Dict[int, List[int]] = {}  # 行 -> 它依次拿到的页的首槽位

    @property
    def available_size(self) -> int:
        """还能放几个 token：空闲页数 × page_size。"""
        return len(self.free_slots) * self.page_size

    def allocate_paged(self, reqs: List[Req]) -> None:
        """给每个请求这一步要写 KV 的位置 [cached_len, device_len) 配上页：一页用完才拿下一页。
        空闲页从尾部拿，几个请求交替增长，拿到的页自然不连续——page table 才真的有用。"""
        ps = self.page_size
        plan: List[tuple[int, int]] = []  # (行, 页在这一行里的序号)
        held: Dict[int, int] = {}  # 行 -> 算上这一步已经排好的页数
        for req in reqs:
            first, last = div_ceil(req.cached_len, ps), div_ceil(req.device_len, ps)
            have = held.get(req.table_idx, len(self._row_pages.get(req.table_idx, [])))
            if have != first:  # 行里的页数和请求的进度对不上：两个请求共用一行，或者请求结束后又被送进来
                raise ValueError(f"{req}: page table 第 {req.table_idx} 行已经有 {have} 页，这个请求却要从第 {first} "
                                 f"页接着分配（两个请求共用一行？或者它已经生成完，行和页都交还了？）")
            if last * ps > self.page_table.shape[1]:  # 否则下面写页表时越界：CPU 上 IndexError，GPU 上设备端断言
                raise ValueError(f"{req}: 要用到第 {last * ps} 个位置，page table 一行只有 "
                                 f"{self.page_table.shape[1]} 个（请求的长度没经过 add_req 查？）")
            held[req.table_idx] = last
            plan += [(req.table_idx, page_idx) for page_idx in range(first, last)]
        if len(plan) > len(self.free_slots):
            raise RuntimeError(f"KV 池的页用完了：这一步要 {len(plan)} 页，"
                               f"只剩 {len(self.free_slots)} 页（--num-pages）")
        rows, cols, slots = [], [], []
        for row, page_idx in plan:
            start = self.free_slots.pop()
            self._row_pages.setdefault(row, []).append(start)
            rows += [row] * ps
            cols += range(page_idx * ps, (page_idx + 1) * ps)
            slots += range(start, start + ps)
        if plan:  # 一次写进 page table：GPU 上是一次拷贝，不是每页一次
            device = self.page_table.device
            self.page_table[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = \
                torch.tensor(slots, dtype=torch.int32, device=device)

    def free(self, table_idx: int) -> None:
        """请求结束：把这一行的页都还回来。"""
        self.free_slots += self._row_pages.pop(table_idx, [])
