"""张量并行的身份：我是第几份（rank），一共几份（size）。每个算子在构造时读它，决定自己切多大。"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DistributedInfo:
    rank: int
    size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"DistributedInfo: 需要 0 <= rank({self.rank}) < size({self.size})")

    def is_primary(self) -> bool:
        return self.rank == 0


_TP_INFO: DistributedInfo | None = None


def set_tp_info(rank: int, size: int) -> None:
    global _TP_INFO
    if _TP_INFO is not None:
        raise RuntimeError("TP 信息已经设置过了；要换一个先调用 reset_tp_info()")
    _TP_INFO = DistributedInfo(rank, size)


def get_tp_info() -> DistributedInfo:
    if _TP_INFO is None:
        raise RuntimeError("TP 信息还没有设置：构造算子之前先 set_tp_info(rank, size)")
    return _TP_INFO


def try_get_tp_info() -> DistributedInfo | None:
    return _TP_INFO


def reset_tp_info() -> None:
    """测试要在一个进程里轮流扮演每个 rank。"""
    global _TP_INFO
    _TP_INFO = None
