"""线性层和它们的张量并行切法。

形状约定（tp 份中的一份，x: (N, in)）：
- LinearReplicated       不切：weight (out, in)
- LinearColParallelMerged 按输出切（列并行），几块输出合在一个矩阵里：weight (Σ out_i/tp, in)，
  本地行 = [块0 的第 r 份 | 块1 的第 r 份 …]
- LinearQKVMerged        q/k/v 合在一起的列并行：weight ((H_q/tp + 2·H_kv') · D, in)；KV 头比 tp 少时复制（H_kv' = 1）
- LinearOProj / LinearRowParallel  按输入切（行并行）：weight (out, in/tp)，各份结果求和（all-reduce）

每一层自己知道怎么从完整的检查点张量里切出本 rank 的那份：shard(full, part)。
所有矩阵乘都走 linear()：CPU 上的 fp32 用 oneDNN，权重在加载后重排一次（prepack_weight），见下面的说明。
"""

from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F

from minisgl.distributed import DistributedCommunicator, get_tp_info
from minisgl.utils import div_even

from .base import BaseOP

# CPU 上 fp32 的 F.linear 走 MKL 的 sgemm：batch 只有几行时（decode 正是这样）它读权重只有内存带宽的一半左右，
# 而且 4 行比 1 行慢一倍多。oneDNN 的 linear 一次把权重流过去，4 行只比 1 行稍慢——批处理的道理才看得见。
# 再进一步：加载后把权重按 oneDNN 的分块布局重排一次（prepack），每一步就不用再按普通布局凑合着读。
# 这些是 torch 的内部算子：没有它们（别的构建、别的平台）就不重排、退回 F.linear；两者只差浮点累加顺序，测试核对过。
_ONEDNN = (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
           and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))
_PACK_ROWS = 4  # 告诉 oneDNN 按几行的输入挑布局：里程碑的 decode batch 是 4 行；十几行（prefill）用它也快


def prepack_weight(weight: torch.Tensor) -> torch.Tensor:
    """(out, in) 的 fp32 CPU 权重 -> oneDNN 分块布局的同形状张量（torch._mkldnn，只能交给 linear() 用）。
    其他情况（GPU、bf16、meta、没有 oneDNN）原样返回。"""
    if _ONEDNN and weight.is_cpu and not weight.is_mkldnn and weight.dtype == torch.float32 and weight.dim() == 2:
        return torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS)
    return weight


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: (N, in)，weight: (out, in)（可以是 prepack_weight 重排过的），bias: (out,) -> (N, out)。"""
    if weight.is_mkldnn:  # 重排过的权重只能交给 oneDNN
        n = x.shape[0]
        if n < _PACK_ROWS:  # 这个布局是按 _PACK_ROWS 行挑的：1 行时补几行 0 反而比只算 1 行快（实测），多出的行丢掉
            x = F.pad(x, (0, 0, 0, _PACK_ROWS - n))  # 在行的方向补 0
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")[:n]
    if _ONEDNN and x.is_cpu and x.dtype == weight.dtype == torch.float32 and x.dim() == 2:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class _LinearTPImpl(BaseOP):
    def __init__(self, full_isize: int, full_osize: int, local_isize: int, local_osize: int, has_bias: bool) -> None:
        self.full_input_size, self.full_output_size = full_isize, full_osize
        self.local_input_size, self.local_output_size = local_isize, local_osize
        self.weight = torch.empty(local_osize, local_isize)
        self.bias = torch.empty(local_osize) if has_bias else None
        tp = get_tp_info()
        self._rank, self._tp = tp.rank, tp.size

    def process_weights_after_loading(self) -> None:
        self.weight = prepack_weight(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class LinearReplicated(_LinearTPImpl):
    def __init__(self, input_size: int, output_size: int, has_bias: bool) -> None:
        super().__init__(input_size, output_size, input_size, output_size, has_bias)


class LinearColParallelMerged(_LinearTPImpl):
    """比如 MLP 的 gate 和 up：两块输出各切 tp 份，本 rank 的两块拼在一起，省一次矩阵乘。"""

    def __init__(self, input_size: int, output_sizes: List[int], has_bias: bool) -> None:
        tp = get_tp_info().size
        self.output_sizes = [div_even(o, tp) for o in output_sizes]
        super().__init__(input_size, sum(output_sizes), input_size, sum(self.output_sizes), has_bias)

    def shard(self, full: torch.Tensor, part: int = 0) -> torch.Tensor:
        n = self.output_sizes[part]
        return full[self._rank * n:(self._rank + 1) * n]  # 按行（输出）切，对 bias 同样适用


class LinearQKVMerged(_LinearTPImpl):
    def __init__(self, hidden_size: int, head_dim: int, num_qo_heads: int, num_kv_heads: int, has_bias: bool) -> None:
        tp = get_tp_info().size
        self.head_dim, self.num_kv_heads = head_dim, num_kv_heads
        self.local_qo_heads = div_even(num_qo_heads, tp)
        self.local_kv_heads = div_even(num_kv_heads, tp, allow_replicate=True)
        local_out = (self.local_qo_heads + 2 * self.local_kv_heads) * head_dim
        super().__init__(hidden_size, (num_qo_heads + 2 * num_kv_heads) * head_dim, hidden_size, local_out, has_bias)

    def shard(self, full: torch.Tensor, part: int = 0) -> torch.Tensor:
        """part: 0 = q，1 = k，2 = v。"""
        if part == 0:
            heads, first = self.local_qo_heads, self._rank * self.local_qo_heads
        elif self._tp > self.num_kv_heads:  # KV 头不够分：每个 rank 拿一个，几个 rank 共用同一个头
            heads, first = 1, self._rank * self.num_kv_heads // self._tp
        else:
            heads, first = self.local_kv_heads, self._rank * self.local_kv_heads
        return full[first * self.head_dim:(first + heads) * self.head_dim]


class LinearRowParallel(_LinearTPImpl):
    """按输入切：每个 rank 只有输入的一段，算出的是部分和，all-reduce 之后才是完整结果。"""

    def __init__(self, input_size: int, output_size: int, has_bias: bool) -> None:
        tp = get_tp_info().size
        super().__init__(input_size, output_size, div_even(input_size, tp), output_size, has_bias)
        self._comm = DistributedCommunicator()

    def shard(self, full: torch.Tensor, part: int = 0) -> torch.Tensor:
        if full.dim() == 1:  # bias 只放在 rank 0，求和之后正好加一次（官方每个 rank 都加，好在没有模型用到）
            return full if self._rank == 0 else torch.zeros_like(full)
        n = self.local_input_size
        return full[:, self._rank * n:(self._rank + 1) * n]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, self.bias)
        return self._comm.all_reduce(y) if self._tp > 1 else y


class LinearOProj(LinearRowParallel):
    """注意力的输出投影：就是一个行并行线性层（名字与官方一致）。"""
