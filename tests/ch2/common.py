"""第 2 章两个测试文件共用的小工具。按完整的点分名字导入：from tests.ch2.common import ...
（各章目录没有 __init__.py，pytest 会把它们放上 sys.path，只写 common 会和别章的同名模块撞上）。"""

TIGHT = dict(rtol=1e-5, atol=1e-5)
