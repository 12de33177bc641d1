"""这台机器和第 6 章的核：生成的每张表的抬头都写它们，换台机器的数字才对得上号。"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

import torch

SIMD_FLAGS = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"]  # 和矩阵乘快慢有关的


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> str:
    """/proc/cpuinfo 里和矩阵乘有关的几个指令集标志（有哪个写哪个）。"""
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return " ".join(f for f in SIMD_FLAGS if f in have) or "没有 AVX2"
    return "未知"


def l3_size() -> str:
    with contextlib.suppress(OSError):
        return Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    return "未知"


def machine_line() -> str:
    """CPU 型号和指令集、核数、L3、torch 版本、线程数。"""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"机器：{cpu_name()}（{cpu_flags()}；L3 {l3_size()}），{cores} 核；torch {torch.__version__}，"
            f"{torch.get_num_threads()} 个线程")


def kernel_summary() -> str:
    """线性层走的是哪条路：第 6 章 minisgl.kernel 的 C++ 核（写明向量宽度和分块），还是退回的 F.linear。
    调用方已经 use_checkpoint 到第 6 章。"""
    from minisgl import kernel

    ext = kernel.extension()
    if ext is None:
        return "全用 F.linear（C++ 核用不了，原因见运行时打印的那一行）"
    (rows, cols), (grows, gcols) = ext.tile, ext.gemm_tile
    return (f"C++ small_linear（1~{ext.max_rows} 行；每次 {ext.vector_width} 个 float 的向量，"
            f"{rows} 行权重 × {cols} 行输入一块）和 gemm（更多行；{grows} 行权重 × {gcols} 行输入一块）")
