"""几个整数小工具：张量并行的切分要求整除，不整除时要给出清楚的错误。"""

from __future__ import annotations


def div_even(a: int, b: int, allow_replicate: bool = False) -> int:
    """a 平均分给 b 份。allow_replicate：份数多于 a 时（比如 KV 头少于 TP 份数），每份 1 个、复制着用。"""
    if allow_replicate and b > a:
        if b % a != 0:
            raise ValueError(f"{b} 份无法均匀复制 {a} 个：{b} 不是 {a} 的整数倍")
        return 1
    if a % b != 0:
        raise ValueError(f"{a} 不能被 {b} 整除，无法平均切成 {b} 份")
    return a // b


def div_ceil(a: int, b: int) -> int:
    return (a + b - 1) // b
