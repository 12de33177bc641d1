"""CPU 上 decode 用的线性层：1~8 行 fp32 输入走 csrc/small_linear.cpp，其余交给 F.linear。

行很少时矩阵乘是在读权重（附录"CPU 上的矩阵乘"）：这个核每个线程顺着读自己那几行权重，读进寄存器就给所有输入行用，
所以 batch 4 读的权重和 batch 1 一样多。MKL 的 sgemm 为大矩阵设计，行很少时在有的 CPU 上读不满带宽，
4 行还比 1 行慢得多。

csrc 下的两个文件（矩阵乘和 cpu_ops.py 用的小算子）编成一个扩展：第一次用时用 torch.utils.cpp_extension 编译
（-O3 -march=native，半分钟左右），结果缓存在 torch 的扩展目录里，之后的进程直接加载。编不了（没有 C++ 编译器、
没有 ninja、编译出错）或设了 MINISGL_KERNEL=off 时，打印一行原因，全用 PyTorch 的算子：结果一样（只差浮点累加顺序），
只是慢。
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

SOURCE = Path(__file__).resolve().parent / "csrc" / "small_linear.cpp"
SOURCES = [SOURCE, SOURCE.with_name("decode_ops.cpp")]  # 同一个扩展：decode_ops.cpp 是 cpu_ops.py 用的小算子
MAX_ROWS = 8  # 和 small_linear.cpp 的 kMaxRows 一致；更多行（prefill）是算力的活，交给 MKL


def _cache_tag() -> str:
    """按 CPU 的指令集分开缓存：-march=native 编出来的库换到指令集不同的机器上会非法指令崩溃。
    也按源文件的位置分开：检查点和读者的工作区各有一份 small_linear.cpp，共用一个名字会来回重编。"""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return hashlib.sha1(f"{platform.machine()} {flags} {SOURCE}".encode()).hexdigest()[:8]


@functools.cache
def extension() -> ModuleType | None:
    """编译（或从缓存加载）C++ 核；用不了时打印一行原因并返回 None（之后全用 PyTorch 的算子）。"""
    if os.environ.get("MINISGL_KERNEL", "on") == "off":
        print("minisgl.kernel：MINISGL_KERNEL=off，全用 PyTorch 的算子（F.linear、F.rms_norm……）", file=sys.stderr)
        return None
    arch = "-mcpu=native" if platform.machine().lower() in ("arm64", "aarch64") else "-march=native"
    flags = ["-O3", arch, *(["-fopenmp"] if sys.platform.startswith("linux") else [])]  # OpenMP：用 torch 的线程池
    name, files = f"minisgl_kernel_{_cache_tag()}", "、".join(p.name for p in SOURCES)
    t0 = time.perf_counter()
    try:
        import ninja  # requirements.txt 钉的 PyPI 包：没激活 venv 时它不在 PATH 上，cpp_extension 找不到

        if not shutil.which("ninja"):
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass  # 没装就靠系统的 ninja
    try:
        from torch.utils.cpp_extension import load

        ext = load(name=name, sources=[str(p) for p in SOURCES], extra_cflags=flags, extra_ldflags=flags[2:],
                   verbose=False)
    except Exception as e:  # 编译器、ninja、编译错误：原因各不相同，都退回 F.linear
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"minisgl.kernel：编译 {files} 失败（{reason[:200]}），"
              "改用 PyTorch 的算子（F.linear、F.rms_norm……，结果相同、decode 慢）；"
              f"要它就装上 C++ 编译器（如 apt-get install g++ / xcode-select --install）和 pip install ninja",
              file=sys.stderr)
        return None
    if time.perf_counter() - t0 > 2:
        print(f"minisgl.kernel：编译了 {files}（{time.perf_counter() - t0:.0f} 秒，之后的进程直接用缓存）",
              file=sys.stderr)
    return ext


# --8<-- [start:linear]
def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """和 F.linear 同签名。x: (N, in)，w: (out, in)，b: (out,) 或 None -> (N, out)。"""
    if x.is_cpu and w.is_cpu and x.dim() == 2 and x.shape[0] <= MAX_ROWS and x.dtype == w.dtype == torch.float32:
        ext = extension()
        if ext is not None:
            return ext.small_linear(x, w, b)
    return F.linear(x, w, b)
# --8<-- [end:linear]
