"""同时跑几份：份数跟着这台机器给本进程的核和空闲内存走；每一份跑完记下它的峰值内存、CPU 秒和墙上秒，下次按它排。

    python -m tools.run_tests          # 份数 = 能用的核数，再被内存压低（见 choose_jobs）
    python -m tools.run_tests -j 3     # 自己定

记录在 .cache/course/parts.json（每台机器自己量；没量过的一份按 GUESS_MB 估）。
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tools.manifest import ROOT

RECORD = ROOT / ".cache" / "course" / "parts.json"
GUESS_MB = 1500  # 没量过的一份：第 6 章一份实测约 1.2 GB，宁多勿少
MEMORY_SHARE = 0.8  # 只用空闲内存的这么多，给系统和别的程序留余地


def usable_cores() -> int:
    """本进程能用的核：taskset、容器的 cpuset 限制过的就按限制后的算（os.cpu_count() 是整台机器的）。"""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_mb() -> int | None:
    """空闲内存（MB）：Linux 读 /proc/meminfo 的 MemAvailable；macOS 问 sysctl；都读不到时是 None（不按内存限）。"""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True).stdout
            return int(out) // 2**20 // 2  # 没有"空闲"这个数：按一半算
        except (OSError, ValueError):
            return None
    return None


@dataclass
class Part:
    """一份上次跑的记录：峰值内存（MB，这份 pytest 和它起的子进程里最大的一个）、CPU 秒、墙上秒。"""
    peak_mb: int = GUESS_MB
    cpu_s: float = 0.0
    wall_s: float = 0.0


def load_record() -> dict[str, Part]:
    try:
        raw = json.loads(RECORD.read_text(encoding="utf-8"))
        return {name: Part(**v) for name, v in raw.items()}
    except (OSError, ValueError, TypeError):
        return {}


def save_record(done: dict[str, Part]) -> None:
    """并进已有的记录（只更新这次跑了的几份）；写到临时文件再改名，几个进程同时写也不会留下半个文件。"""
    record = load_record()
    record.update(done)
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    tmp = RECORD.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({k: vars(v) for k, v in sorted(record.items())}, indent=1), encoding="utf-8")
    os.replace(tmp, RECORD)


def choose_jobs(names: list[str]) -> tuple[int, str]:
    """(同时跑几份, 一行说明)。从能用的核数起，直到最大的那几份的峰值内存加起来放得进空闲内存的 MEMORY_SHARE。"""
    cores = usable_cores()
    record = load_record()
    peaks = sorted((record.get(n, Part()).peak_mb for n in names), reverse=True) or [GUESS_MB]
    free = available_mb()
    jobs = max(1, min(cores, len(names)))
    if free is not None:
        while jobs > 1 and sum(peaks[:jobs]) > free * MEMORY_SHARE:
            jobs -= 1
    measured = "按上次量到的峰值内存" if any(n in record for n in names) else f"每份按 {GUESS_MB} MB 估"
    mem = f"，空闲内存 {free / 1024:.1f} GB（{measured}）" if free is not None else ""
    return jobs, f"同时跑 {jobs} 份：本进程能用 {cores} 个核{mem}；-j N 可以改"


def threads_per_job(jobs: int) -> int:
    """每份用几个线程：核平分给同时跑的几份（份数被内存压低时，多出来的核给每份多开线程）。"""
    return max(1, usable_cores() // max(1, jobs))


def wait_measured(proc: subprocess.Popen) -> Part:
    """等 proc 结束，读它的资源用量（os.wait4：这个进程和它等到了的子孙进程），返回峰值内存和 CPU 秒。
    没有 wait4 的平台（Windows）只等结束。"""
    if not hasattr(os, "wait4"):
        proc.wait()
        return Part()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    scale = 1 if platform.system() == "Darwin" else 1024  # ru_maxrss：Linux 是 KB，macOS 是字节
    return Part(peak_mb=int(usage.ru_maxrss * scale / 2**20) or 1, cpu_s=usage.ru_utime + usage.ru_stime)
