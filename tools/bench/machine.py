"""这台机器和第 6 章的核：生成的每张表的抬头都写它们，换台机器的数字才对得上号。"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar


T = TypeVar("T")

SIMD_FLAGS = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"]  # 和矩阵乘快慢有关的


def _cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo 第一个 CPU 的字段；不是 Linux 时是空的。"""
    with contextlib.suppress(OSError):
        head = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
        return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in head.splitlines())}
    return {}


def cpu_name() -> str:
    """型号名后面跟 family / model：虚拟机里型号名常常只有"AMD EPYC"，分不出是哪一代。"""
    info = _cpuinfo()
    if "model name" not in info:
        return platform.processor() or platform.machine()
    if "cpu family" not in info:
        return info["model name"]
    return f"{info['model name']} family {info['cpu family']} model {info.get('model', '?')}"


def cpu_flags() -> str:
    """/proc/cpuinfo 里和矩阵乘有关的几个指令集标志（有哪个写哪个）。"""
    if "flags" not in (info := _cpuinfo()):
        return "未知"
    have = set(info["flags"].split())
    return " ".join(f for f in SIMD_FLAGS if f in have) or "没有 AVX2"


def l3_size() -> str:
    with contextlib.suppress(OSError):
        return Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    return "未知"


def machine_line() -> str:
    """CPU 型号和指令集、核数、L3、torch 版本、线程数。"""
    import torch  # 用到时才 import：course.py demo 只要 call_noting_load，不为它多等一次 import torch

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
    return (f"C++ small_linear（1~{ext.max_rows} 行；每次 {ext.vector_width} 个 float 的向量；"
            f"读法 tile 是 {rows} 行权重 × {cols} 行输入一块、更多行用 gemm 的小块，"
            f"读法 row 在不超过 {ext.row_inputs} 行、输入不超过 {ext.stream_input // 1024} KB 时一行一行顺着读，"
            f"一次至多 {ext.unroll} 个向量；{kernel.chosen_plan().line()}）"
            f"和 gemm（更多行；{grows} 行权重 × {gcols} 行输入一块）")


def steal_seconds() -> float:
    """/proc/stat 里所有核加起来被宿主机拿走的 CPU 时间（steal，秒）；不是 Linux 或读不到时是 0。"""
    return _cpu_ticks()[1]


class Steady:
    """虚拟机的 CPU 会被宿主机限流（steal）：被拿走的时间里两个线程都停着，一步 decode 能慢一倍。
    run(fn) 量一项；这段时间里被拿走的超过 STEAL 就歇一会儿重测，最多 TRIES 次；
    记下重测了几次、留下的那次被拿走多少。"""

    STEAL, TRIES, PAUSE = 0.005, 4, 2.0

    def __init__(self) -> None:
        self.cores = os.cpu_count() or 1  # /proc/stat 第一行是全机所有核的和：按全机的核数折算，不按本进程能用的
        self.retries, self.worst = 0, 0.0

    def run(self, fn: Callable[[], T]) -> T:
        for _ in range(self.TRIES - 1):
            out, frac = self._timed(fn)
            if frac <= self.STEAL:
                break
            self.retries += 1
            time.sleep(self.PAUSE)
        else:
            out, frac = self._timed(fn)  # 最后一次：不论被拿走多少都留下，line() 会写出来
        self.worst = max(self.worst, frac)
        return out

    def _timed(self, fn: Callable[[], T]) -> tuple[T, float]:
        s0, t0 = steal_seconds(), time.perf_counter()
        out = fn()
        return out, (steal_seconds() - s0) / max((time.perf_counter() - t0) * self.cores, 1e-9)

    def line(self) -> str:
        return (f"宿主机拿走的 CPU（/proc/stat 的 steal）超过 {self.STEAL:.1%} 的测量重测，共重测 {self.retries} 次；"
                f"留下的测量里最多被拿走 {self.worst:.1%}")


def _cpu_ticks() -> tuple[float, float]:
    """(/proc/stat 第一行里全机忙着的 CPU 秒, 其中宿主机拿走的 steal 秒)；读不到时是 (0, 0)。"""
    with contextlib.suppress(OSError, IndexError, ValueError):
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        hz = os.sysconf("SC_CLK_TCK")
        return (sum(v) - v[3] - v[4]) / hz, v[7] / hz  # 去掉 idle、iowait
    return 0.0, 0.0


def call_noting_load(fn: Callable[[], T], busy: float = 0.25) -> tuple[T, str | None]:
    """跑 fn（比如演示的子进程），返回 (结果, 一行提醒或 None)。这段时间里别的程序加上宿主机拿走的 CPU 超过全机的
    busy 时提醒：上面打印的时间不准。自己用的 CPU 从 os.times() 的子进程时间里减掉。"""
    (b0, s0), c0, t0 = _cpu_ticks(), os.times(), time.perf_counter()
    out = fn()
    (b1, s1), c1, wall = _cpu_ticks(), os.times(), time.perf_counter() - t0
    own = (c1.children_user + c1.children_system + c1.user + c1.system
           - c0.children_user - c0.children_system - c0.user - c0.system)
    cores = os.cpu_count() or 1
    others = max(0.0, (b1 - b0) - own) / max(wall * cores, 1e-9)
    if b1 == 0 or others < busy:
        return out, None
    steal = (s1 - s0) / max(wall * cores, 1e-9)
    return out, (f"这台机器正忙，上面的时间不准：这 {wall:.0f} 秒里别的程序和宿主机（steal {steal:.0%}）"
                 f"占了全机 {others:.0%} 的 CPU（{cores} 核）")
