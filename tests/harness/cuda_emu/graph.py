"""torch.cuda.CUDAGraph 和 torch.cuda.graph 的替身：录下一段里设备上的每个算子，重放时在同一批张量上再算一遍。

真的 CUDA 图录的是 kernel 和它们的参数：张量按地址（录图时分配的留在图的显存池里），Python 里的数按录的那一刻。
这里一样：每个算子连同参数录下（张量按身份，数原样冻住），输出张量留着；重放时按顺序重算，结果写回录下的那个
输出张量（原地算子、视图直接作用在同一块数据上）。所以录图时从主存读进来的数（Python 的 len()、int、
用它们建的张量），重放时还是当时的值：和真 GPU 上一样给出错的 token。录图时读回主存直接报错（tensor._sync）。
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .tensor import Capture, _mutated_arg, _unwrap, host_args, leaves


def _aliases_input(func) -> bool:
    """视图算子（view、slice、transpose…）的输出和输入共用数据：重算时不用写回。"""
    return any(r.alias_info is not None for r in func._schema.returns)


class CUDAGraph:
    """录一次、重放多次。"""

    def __init__(self, *args, **kwargs) -> None:
        self.ops: list | None = None
        self.steps: list = []

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        if Capture.active is not None:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing（已经在录另一张图）")
        self.ops = []
        Capture.active = self.ops

    def capture_end(self) -> None:
        Capture.active = None
        self.steps = [_step(*op) for op in self.ops or []]  # 参数录下时就拆好：重放时只剩真算和写回

    def replay(self) -> None:
        if self.ops is None:
            raise RuntimeError("CUDA graph 还没录就 replay")
        with _disable_current_modes():  # 录下的都是 CPU 上的参数：不必再经过整个进程的 CudaMode
            for func, u_args, u_kwargs, outs in self.steps:
                new = func(*u_args, **u_kwargs)
                for old, fresh in zip(outs, leaves((new,))):
                    if old is not None:
                        old.copy_(fresh)

    def reset(self) -> None:
        self.ops = None
        self.steps = []

    def pool(self) -> tuple[int, int]:
        return (0, id(self))  # 显存池的句柄：这里只用来传给下一张图，不分配什么


def _step(func, args, kwargs, out) -> tuple:
    """录下的一个算子 -> (func, CPU 上的参数, 要写回的输出)。张量按身份：拆出来的还是同一块数据。"""
    u_args, u_kwargs = host_args(args, kwargs)
    if _mutated_arg(func, args, kwargs) is not None or _aliases_input(func):
        return func, u_args, u_kwargs, []  # 原地算子直接写进同一块数据；视图本来就指着它
    outs = [_unwrap(o) if isinstance(o, torch.Tensor) else None for o in leaves((out,))]
    return func, u_args, u_kwargs, outs


class graph:  # noqa: N801 —— 和 torch.cuda.graph 同名
    """with torch.cuda.graph(g, pool=..., stream=...): 的替身。真的进入前先同步一次、换到录图用的流。"""

    def __init__(self, cuda_graph: CUDAGraph, pool=None, stream=None, capture_error_mode: str = "global") -> None:
        self.cuda_graph = cuda_graph

    def __enter__(self) -> None:
        torch.cuda.synchronize()
        self.cuda_graph.capture_begin()

    def __exit__(self, *exc) -> None:
        self.cuda_graph.capture_end()


__all__ = ["CUDAGraph", "graph"]
