"""课程的工具，在仓库根目录下用 python -m tools.X 运行（例如 python -m tools.run_tests ch3）。

按关心的事分包，和章节代码一样一个包一件事；import 只往下走：course.py → 各包 → 这里的 manifest.py：

- manifest.py：检查点清单和任务表的读法，几乎每个模块都用它；run_tests.py：跑测试的入口（course.py test / check、
  start --from 的检查、--arch 都经过它）；
- workbench/：读者的工作台，start、check 的进度表、progress、demo DIR（course.py 调用）；
- book/：书的构建钩子、示意图、报错表，以及作者把修正往后带的 carry_forward（mkdocs 和作者调用）；
- trace/：course.py trace 的记录、比较、画图；
- models/：用哪个模型、做真的小模型和离线小模型（演示、测试、书、trace、bench 都问它）；
- arch/：在 qemu 模拟的别的架构里跑测试（course.py test --arch）；
- bench/：CPU 上的基准，书里的速度数字都从这里来。
"""
