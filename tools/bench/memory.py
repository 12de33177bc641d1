"""和内存有关的三样：读带宽（decode 每步把权重读一遍，它定下限）、加载时常驻内存的峰值、权重实际落在哪种页上。"""

from __future__ import annotations

import bisect
import re
import time
from pathlib import Path

import torch
from typing_extensions import Self

FLOOR_BUFFER = 1 << 28  # 1 GiB fp32：远大于 L3


def read_bandwidth(seconds: float = 1.0) -> tuple[float, str]:
    """内存读带宽（GB/s）和一句怎么量的：1 GiB 反复从头读到尾，读满约 `seconds` 秒取平均；两种读法——tensor.sum()
    和第 6 章 C++ 核的 stream_read（和矩阵乘一样的向量读、一样的线程分法）——取快的那个。
    读满约 1 秒（和一次 decode 计时差不多长）是因为共用机器的带宽时高时低：只读一次（几十 ms）容易碰上邻居恰好
    空闲的一瞬，量出的下限会比任何一段持续的读都低。这块内存和 Engine 的权重放在同一种页上
    （kernel.to_huge_pages：有透明大页就是 2 MB 页），否则量的是 4 KB 页的读法，下限反而比 Engine 慢。"""
    from minisgl.kernel import extension, to_huge_pages  # 调用方已经 use_checkpoint 到第 6 章

    plain = torch.ones(FLOOR_BUFFER)
    buf = to_huge_pages(plain)
    pages = "2 MB 大页上的 " if buf is not plain else ""
    del plain
    ext = extension()
    ways = {"sum()": lambda: buf.sum(), **({"C++ 的 stream_read": lambda: ext.stream_read(buf)} if ext else {})}
    best = {}
    for name, read in ways.items():
        read()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            read()
            n += 1
        best[name] = buf.nbytes / ((time.perf_counter() - t0) / n) / 1e9
    name = max(best, key=best.get)
    others = "，".join(f"{k} {v:.1f}" for k, v in best.items() if k != name)
    return best[name], (f"{pages}1 GiB 连续读约 1 秒取平均，{'、'.join(ways)} 取快的：{name}"
                        + (f"（{others}）" if others else "") + "；几轮里取最快的一轮")


class PeakRSS:
    """加载期间进程常驻内存（RSS，含 mmap 进来的文件页）的峰值比加载前多了多少：先往 /proc/self/clear_refs 写 5
    把内核记的峰值（VmHWM）清成当前值，加载完再读 VmHWM。只在 Linux 上有；量不到时 delta 是 None。"""

    def __enter__(self) -> Self:
        self.delta: int | None = None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.before = self._status("VmRSS")
        except OSError:
            self.before = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.before is not None:
            self.delta = self._status("VmHWM") - self.before

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def huge_page_line(tensors: list[torch.Tensor]) -> str:
    """这些张量实际有多少落在 2 MB 大页上：把 /proc/self/smaps 里装着它们的映射的 AnonHugePages 加起来。
    madvise 只是请求，内存太碎时内核照样给 4 KB 页，所以量实际给了多少，而不是看调没调。"""
    total = sum(t.numel() * t.element_size() for t in tensors)
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return f"权重 {total / 2**20:.0f} MiB，量不到用的是哪种页（没有 /proc/self/smaps）"
    starts, ends, huge = [], [], []
    for line in text.splitlines():
        if m := re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line):
            starts.append(int(m[1], 16))
            ends.append(int(m[2], 16))
            huge.append(0)
        elif line.startswith("AnonHugePages:"):
            huge[-1] = int(line.split()[1]) * 1024
    hit = {}
    for t in tensors:
        i = bisect.bisect_right(starts, t.data_ptr()) - 1
        if i >= 0 and t.data_ptr() < ends[i]:
            hit[i] = huge[i]
    return f"权重 {min(sum(hit.values()), total) / 2**20:.0f} / {total / 2**20:.0f} MiB 在 2 MB 大页上"
