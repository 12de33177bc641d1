"""线性层和它们的张量并行切法。

形状约定（tp 份中的一份，x: (N, in)）：
- LinearReplicated       不切：weight (out, in)
- LinearColParallelMerged 按输出切（列并行），几块输出合在一个矩阵里：weight (Σ out_i/tp, in)，
  本地行 = [块0 的第 r 份 | 块1 的第 r 份 …]
- LinearQKVMerged        q/k/v 合在一起的列并行：weight ((H_q/tp + 2·H_kv') · D, in)；KV 头比 tp 少时复制（H_kv' = 1）
- LinearOProj / LinearRowParallel  按输入切（行并行）：weight (out, in/tp)，各份结果求和（all-reduce）

每一层自己知道怎么从完整的检查点张量里切出本 rank 的那份：shard(full, part)，切之前先核对完整形状。
第 6 章起加载权重时选一次矩阵乘：CPU 上的 fp32 换成 minisgl/kernel 的 linear（和 F.linear 同签名，decode 的
1~8 行走 C++ 的小批量矩阵乘，见附录"CPU 上的矩阵乘"），其余照旧用 F.linear。
"""

from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F

from minisgl.distributed import DistributedCommunicator, get_tp_info
from minisgl.kernel import cpu_op
from minisgl.utils import div_even

from .base import _STATE_DICT, BaseOP, _check_full_shape


class _LinearTPImpl(BaseOP):
    def __init__(self, full_isize: int, full_osize: int, local_isize: int, local_osize: int, has_bias: bool) -> None:
        self.full_input_size = full_isize
        self.full_output_size = full_osize
        self.local_input_size = local_isize
        self.local_output_size = local_osize
        self.weight = torch.empty(local_osize, local_isize)
        self.bias = torch.empty(local_osize) if has_bias else None
        tp = get_tp_info()
        self._tp_rank = tp.rank
        self._tp_size = tp.size
        self._linear = F.linear

    # --8<-- [start:bind]
    def load_state_dict(self, state_dict: _STATE_DICT, *, prefix: str = "", _internal: bool = False) -> None:
        super().load_state_dict(state_dict, prefix=prefix, _internal=_internal)
        self._linear = cpu_op("linear", self.weight) or F.linear  # 权重到了才知道设备和 dtype：只选这一次
    # --8<-- [end:bind]

    def _check_full(self, full: torch.Tensor, rows: int) -> torch.Tensor:
        """weight 是 (rows, 完整的输入维)，bias 是 (rows,)。"""
        return _check_full_shape(full, rows, self.full_input_size) if full.dim() == 2 else _check_full_shape(full, rows)

    def shard(self, full: torch.Tensor, part: int = 0) -> torch.Tensor:
        return self._check_full(full, self.full_output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(x, self.weight, self.bias)


class LinearReplicated(_LinearTPImpl):
    def __init__(self, input_size: int, output_size: int, has_bias: bool) -> None:
        super().__init__(input_size, output_size, input_size, output_size, has_bias)


class LinearColParallelMerged(_LinearTPImpl):
    """比如 MLP 的 gate 和 up：两块输出各切 tp 份，本 rank 的两块拼在一起，省一次矩阵乘。"""

    def __init__(self, input_size: int, output_sizes: List[int], has_bias: bool) -> None:
        tp_size = get_tp_info().size
        self.output_sizes = [div_even(o, tp_size) for o in output_sizes]
        super().__init__(input_size, sum(output_sizes), input_size, sum(self.output_sizes), has_bias)

    def shard(self, full: torch.Tensor, part: int = 0) -> torch.Tensor:
        n = self.output_sizes[part]
        self._check_full(full, n * self._tp_size)
        return full[self._tp_rank * n:(self._tp_rank + 1) * n]  # 按行（输出）切，对 bias 同样适用


class LinearQKVMerged(_LinearTPImpl):
    def __init__(self, hidden_size: int, head_dim: int, num_qo_heads: int, num_kv_heads: int, has_bias: bool) -> None:
        tp_size = get_tp_info().size
        self.head_dim = head_dim
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.local_qo_heads = div_even(num_qo_heads, tp_size)
        self.local_kv_heads = div_even(num_kv_heads, tp_size, allow_replicate=True)
        local_out = (self.local_qo_heads + 2 * self.local_kv_heads) * head_dim
        super().__init__(hidden_size, (num_qo_heads + 2 * num_kv_heads) * head_dim, hidden_size, local_out, has_bias)

    def shard(self, full: torch.Tensor, part: int = 0) -> torch.Tensor:
        """part: 0 = q，1 = k，2 = v。"""
        self._check_full(full, (self.num_kv_heads if part else self.num_qo_heads) * self.head_dim)
        rank, tp_size = self._tp_rank, self._tp_size
        if part == 0:
            heads, first = self.local_qo_heads, rank * self.local_qo_heads
        elif tp_size > self.num_kv_heads:  # KV 头不够分：每个 rank 拿一个，几个 rank 共用同一个头
            heads, first = 1, rank * self.num_kv_heads // tp_size
        else:
            heads, first = self.local_kv_heads, rank * self.local_kv_heads
        return full[first * self.head_dim:(first + heads) * self.head_dim]


class LinearOProj(_LinearTPImpl):
    """注意力的输出投影，按输入切（行并行）：每个 rank 只有输入的一段，算出部分和，all-reduce 之后才完整。"""

    def __init__(self, input_size: int, output_size: int, has_bias: bool) -> None:
        local_isize = div_even(input_size, get_tp_info().size)
        _LinearTPImpl.__init__(self, input_size, output_size, local_isize, output_size, has_bias)
        self._comm = DistributedCommunicator()

    def shard(self, full: torch.Tensor, part: int = 0) -> torch.Tensor:
        self._check_full(full, self.full_output_size)
        if full.dim() == 1:  # bias 只放在 rank 0：各份求和之后正好加一次
            return full if self._tp_rank == 0 else torch.zeros_like(full)
        n = self.local_input_size
        return full[:, self._tp_rank * n:(self._tp_rank + 1) * n]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._linear(x, self.weight, self.bias)
        return self._comm.all_reduce(y) if self._tp_size > 1 else y


class LinearRowParallel(LinearOProj):
    """MLP 的 down_proj：和 LinearOProj 一模一样的行并行，构造、切法、前向都继承下来。"""
