"""CPU 上把大权重放进 2 MB 的透明大页（Linux 的 THP）。

decode 每一步把全部权重从头读到尾。按 4 KB 一页，Qwen3-0.6B 的 2.3 GB 权重是 58 万页，TLB 只装得下几千项，
几乎每读 4 KB 就要查一次页表；按 2 MB 一页只有一千多页。很多机器只给 madvise 过的内存大页
（/sys/kernel/mm/transparent_hugepage/enabled 是 [madvise]），所以这里自己映射一段对齐的匿名内存，
madvise(MADV_HUGEPAGE) 之后再把权重拷进去。拿不到大页（不是 Linux、THP 关着、内存太碎）也照样能用，只是还是 4 KB 页。
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20  # x86-64 和 arm64（4 KB 基页）上 THP 的大小


@functools.cache
def _thp_enabled() -> bool:
    try:
        return "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:  # 不是 Linux，或者内核没编进 THP
        return False


@functools.cache
def _malloc_trim():
    """glibc 的 malloc_trim(0)：把堆里已经释放的内存还给系统。别的 libc 没有它，返回 None。"""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def to_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """CPU 上至少 2 MB 的张量、系统有 THP：返回放在大页里的一份拷贝（值、形状、dtype 都不变）；否则原样返回 t。"""
    if not (t.is_cpu and t.nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE") and _thp_enabled()):
        return t
    if (trim := _malloc_trim()) is not None:  # 前一个拷走的权重已经释放，但 glibc 把堆中间释放的块留着不还：
        trim(0)  # 不还的话，加载完常驻内存要多出几百 MB（加载时的峰值也是）
    buf = mmap.mmap(-1, t.nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # 多映射 2 MB 好对齐
    start = -torch.frombuffer(buf, dtype=torch.uint8, count=1).data_ptr() % HUGE_PAGE  # 第一个 2 MB 边界
    buf.madvise(mmap.MADV_HUGEPAGE, start, t.nbytes // HUGE_PAGE * HUGE_PAGE)  # 不满 2 MB 的尾巴留给 4 KB 页
    out = torch.frombuffer(buf, dtype=t.dtype, count=t.numel(), offset=start).view(t.shape)  # 张量活着，映射就在
    return out.copy_(t)
