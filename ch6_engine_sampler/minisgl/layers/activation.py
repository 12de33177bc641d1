"""门控激活：x 的前一半过 SiLU，乘以后一半。x: (N, 2I) -> (N, I)。

第 6 章起算式在 minisgl/kernel（CPU 上是一次 C++ 调用，其余是原来的 F.silu(x1) * x2）；官方也是一行转给 flashinfer。"""

from minisgl.kernel import silu_and_mul

__all__ = ["silu_and_mul"]
