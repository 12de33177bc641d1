"""模拟的 CUDA 的子进程：python-emu 把本目录放上 PYTHONPATH，解释器启动时 import 这个文件，进入整个进程的模拟
（../whole.py）。开关 MINISGL_EMULATE_CUDA 不是 1 时什么也不做。别处还有 sitecustomize（有的发行版的 Python
自带一个）时照常执行它：这个文件只是排在它前面。"""

import importlib.machinery
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_next = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _here])
if _next is not None and _next.loader is not None:
    _next.loader.exec_module(type(sys)("sitecustomize"))

if os.environ.get("MINISGL_EMULATE_CUDA") == "1":
    _root = os.path.abspath(os.path.join(_here, *[os.pardir] * 4))
    sys.path.insert(0, _root)  # 只为 import 模拟本身；import 完拿掉，子进程的 sys.path 和平时一样
    try:
        from tests.harness.cuda_emu.whole import start
    finally:
        sys.path.remove(_root)
    _problem = start()
    if _problem is not None:
        raise SystemExit(f"错误：MINISGL_EMULATE_CUDA=1，但模拟的 CUDA 用不了：{_problem}")
