"""内核：性能敏感、因机器而异的那一层（官方在这里放 CUDA 内核）。阶段一只有 CPU 上 decode 用的：
C++ 核（小批量矩阵乘，和一步 decode 里的几个小算子：RMSNorm、RoPE、写 KV、decode 注意力、SiLU 门控，源码在 csrc/，
由 utils.py 编译，1~8 行的矩阵乘用哪种读法由 plan.py 在本机量出来），以及把大权重放进 2 MB 大页（huge_pages.py）。

前几章的算式留在各层里。从第 6 章开始量速度，各层在知道自己的数据放在哪儿时（构造、加载权重）用 cpu_op 选一次：
CPU 上的 fp32 拿到同签名的 C++ 版，别的（GPU、bf16、扩展编不了）拿到 None、照旧用原来的算式。
这一层是给好的代码：它不认识 layers，layers 调它。"""

from .huge_pages import to_huge_pages
from .utils import chosen_plan, cpu_op, extension, load_jit, num_threads

__all__ = ["chosen_plan", "cpu_op", "extension", "load_jit", "num_threads", "to_huge_pages"]
