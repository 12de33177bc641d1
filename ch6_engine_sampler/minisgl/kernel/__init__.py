"""内核：性能敏感、因机器而异的那一层（官方在这里放 CUDA 内核）。阶段一只有 CPU 上 decode 用的小批量矩阵乘。

前几章的算子都直接用 F.linear；从第 6 章开始量速度，线性层和 LM head 改调这里的 linear()。
这一层是给好的代码：它不认识 layers，layers 调它。"""

from .cpu_linear import MAX_ROWS, extension, linear

__all__ = ["MAX_ROWS", "extension", "linear"]
