"""内核：性能敏感、因机器而异的那一层（官方在这里放 CUDA 内核）。阶段一只有 CPU 上的线性层。

前几章的算子都直接用 F.linear；从第 6 章开始量速度，线性层和 LM head 改调这里的 linear()，
Engine 加载完权重后调一次 prepare_model()，在这台机器上量出每种形状最快的做法。"""

from .cpu_linear import (KERNELS, ONEDNN, bmm_blocks, forced_kernel, linear, pack, prepare_linear_weights,
                         prepare_model, report, reset, run_kernel)

__all__ = ["KERNELS", "ONEDNN", "bmm_blocks", "forced_kernel", "linear", "pack", "prepare_linear_weights",
           "prepare_model", "report", "reset", "run_kernel"]
