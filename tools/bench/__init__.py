"""CPU 上的基准，书里的数字都从这里来，每个模块一件事：

- machine.py：这台机器和第 6 章的核（CPU 型号、指令集、核的编译设置）——每张表的抬头；
- memory.py：内存读带宽（decode 的下限）、加载时的峰值常驻内存、权重落在哪种页上；
- timing.py：第 0 步骨架、HF transformers、第 6 章 Engine 的 prefill 和 decode 计时（Engine 用第 6 章 generate.py 的
  一步，即调度器的三个角色 + 前向）；profile.py：一步 decode 调了多少算子、矩阵乘占多少；
- llama.py（和它的转换脚本 gguf_convert.py）：可选的 llama.cpp 对照；
- report.py：表的列、行、比值和目标，把结果写成 markdown；__main__.py：python -m tools.bench 的命令行；
- kernels.py：python -m tools.bench.kernels，只测线性层的核。

速度只在这里测、只在这里报，测试从不断言耗时。
"""
