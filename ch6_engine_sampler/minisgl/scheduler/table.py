from __future__ import annotations

import torch


class TableManager:
    """page table 的行：每个在跑的请求占一行。token_pool 和 page table 同形状，记每行每个位置的 token id。"""

    def __init__(self, max_running_reqs: int, page_table: torch.Tensor) -> None:
        self._max_running_reqs = max_running_reqs
        self._free_slots = list(range(max_running_reqs))  # 最后一行（假请求的）不在这里
        self.page_table = page_table
        self.token_pool = torch.zeros_like(page_table, dtype=torch.int32)

    @property
    def available_size(self) -> int:
        """还有几行空着（假请求的最后一行不算）。"""
        return len(self._free_slots)

    def allocate(self) -> int:
        """拿一个空行的行号（从空闲列表尾部）；都在用时 RuntimeError，写出 max_running_req。"""
        if not self._free_slots:
            raise RuntimeError(f"page table 的行都在用：同时在跑的请求最多 max_running_req={self._max_running_reqs} 个")
        return self._free_slots.pop()

    def free(self, slot: int) -> None:
        """还回一行；没分配过的行（或还了两次）抛 ValueError。"""
        if not 0 <= slot < self._max_running_reqs or slot in self._free_slots:
            raise ValueError(f"page table 第 {slot} 行没有被分配，不能释放")
        self._free_slots.append(slot)
