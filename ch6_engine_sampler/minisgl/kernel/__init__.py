"""内核：性能敏感、因机器而异的那一层（官方在这里放 CUDA 内核）。阶段一只有 CPU 上 decode 用的：
C++ 核（小批量矩阵乘，和一步 decode 里的几个小算子：RMSNorm、RoPE、写 KV、decode 注意力、SiLU 门控），
以及把大权重放进 2 MB 大页（huge_pages.py）。

前几章的算子都直接用 PyTorch；从第 6 章开始量速度，layers / kvcache / attention 改调这里同签名的函数。
每个函数在 C++ 核用不了时退回前几章的 PyTorch 算式。这一层是给好的代码：它不认识 layers，layers 调它。"""

from .cpu_linear import MAX_ROWS, extension, linear
from .cpu_ops import add_rms_norm, apply_rope, decode_attention, rms_norm, silu_and_mul, store_cache
from .huge_pages import to_huge_pages

__all__ = ["MAX_ROWS", "add_rms_norm", "apply_rope", "decode_attention", "extension", "linear", "rms_norm",
           "silu_and_mul", "store_cache", "to_huge_pages"]
