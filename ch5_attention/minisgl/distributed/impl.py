"""张量并行的两种通信：行并行的结果求和（all-reduce），词表并行的 logits 拼接（all-gather，沿第 0 维）。

算子只在 tp_size > 1 时才调用这里，所以单卡从不碰 torch.distributed。
"""

from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist


class DistributedImpl:
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class TorchDistributedImpl(DistributedImpl):
    """用 torch.distributed（CPU 上是 gloo）。"""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if dist.get_world_size() > 1:
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size()
        if world == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous())  # gloo 不一定支持 all_gather_into_tensor，用列表版最稳
        return torch.cat(parts, dim=0)


class DistributedCommunicator:
    plugins: List[DistributedImpl] = [TorchDistributedImpl()]  # 类属性：所有算子共用，最后一个生效

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self.plugins[-1].all_reduce(x)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return self.plugins[-1].all_gather(x)
