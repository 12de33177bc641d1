"""1~8 行的矩阵乘用哪种读法（small_linear.cpp 开头的 variant）：不按 CPU 写规则，在读者的机器上量出来。

同一种读法在 Zen 5 上快、在 Zen 4 上慢 15~35%（附录"按实测选"）：规则只在写它的那台机器上对。所以扩展第一次载入时，
在一组固定的形状（Qwen3-0.6B 两层的线性层，120 MB，比常见的 L3 大）上、用这时的线程数，把能用的读法轮流量几轮、
各取中位数，给每个行数挑最快的，写进 C++ 的 plan 表；线性层每次调用只查表，不再选。
结果存在库旁边的 plan.json 里，按 CPU 型号、指令集、线程数和库（源码、编译选项）分开：第二次起直接读，0 秒。
MINISGL_KERNEL_VARIANT=tile（或 row）不量，强制用这一种（它管不了的行数用 tile）：测试和 A/B 用。
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import torch

VARIANT_ENV = "MINISGL_KERNEL_VARIANT"
SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]  # Qwen3-0.6B 一层的 qkv、o、gate_up、down
LAYERS = 2
ROUNDS = 7  # 轮流量几轮：每轮每个行数的几种读法紧挨着各跑一遍，顺序一轮正一轮反
TIE = 0.01  # 中位数差不到 1% 算打平：取 variants 里靠前的那种（tile 在前）


@dataclass
class Plan:
    table: dict[int, str]  # 行数 1~8 -> 读法
    margins: dict[int, tuple[str, float]] = field(default_factory=dict)  # 有得选的行数 -> (次快的, 它慢多少)
    how: str = "实测"  # 实测 / 缓存 / 强制
    seconds: float = 0.0  # 量了多久（缓存、强制时 0）
    threads: int = 0
    load: float | None = None  # 量的时候机器的 1 分钟平均负载；不小于核数时这张表不准（busy）

    def busy(self) -> str:
        """量的时候机器正忙就说一句（空串：不忙，或不是量出来的）。"""
        if self.load is None or self.load < cores():
            return ""
        return f"；量的时候机器正忙（1 分钟平均负载 {self.load:.1f}，{cores()} 核），闲下来后下一次载入会重新量"

    def _runs(self, key) -> list[tuple[str, int, int]]:
        """连着的、key 相同的行数合成一段：(读法, 第一行, 最后一行)。"""
        runs = []
        for _, group in itertools.groupby(self.table.items(), key=lambda item: key(*item)):
            rows = [n for n, _ in group]
            runs.append((self.table[rows[0]], rows[0], rows[-1]))
        return runs

    def line(self) -> str:
        """一行：每个行数用哪种、比次快的那种快多少（载入时、tools.bench 和 demo 打印它）。"""
        cells = []  # 有得选的行数各写一格；没得选的连着写：5~8 行 tile
        for v, lo, hi in self._runs(lambda n, v: (v, n if n in self.margins else 0)):
            if lo in self.margins:
                other, m = self.margins[lo]
                cells.append(f"{lo} 行 {v}" + (f"（比 {other} 快 {m:.0%}）" if m >= 0.005 else f"（和 {other} 打平）"))
            else:
                only = "（只有这一种）" if self.how in ("实测", "缓存") else ""
                cells.append(f"{lo}~{hi} 行 {v}{only}" if hi > lo else f"{lo} 行 {v}{only}")
        src = {"实测": f"本机实测 {self.seconds:.1f} 秒", "缓存": "本机实测过，读自缓存"}.get(self.how, self.how)
        return f"small_linear 的读法（{src}，{self.threads} 个线程）：" + "、".join(cells) + self.busy()

    def short(self) -> str:
        """里程碑用的短的一行：连着同一种读法的行数合起来，加上领先次快的多少（最少~最多）。"""
        runs = self._runs(lambda n, v: v)
        parts = "、".join(f"{lo}~{hi} 行 {v}" if hi > lo else f"{lo} 行 {v}" for v, lo, hi in runs)
        lead = sorted(m for _, m in self.margins.values() if m >= 0.005)
        ties = len(self.margins) - len(lead)  # 差不到 TIE：取的是靠前的那种，不是更快的那种
        ahead = (f"，领先次快的 {lead[0]:.0%}" + (f"~{lead[-1]:.0%}" if len(lead) > 1 else "")) if lead else ""
        even = f"，{ties} 个行数和次快的打平（差不到 {TIE:.0%}，取靠前的）" if ties else ""
        src = {"实测": "本机实测", "缓存": "本机实测过"}.get(self.how, self.how)
        return f"small_linear 的读法（{src}）：{parts}{ahead}{even}{self.busy()}"


# --8<-- [start:choose]
def choose(medians: dict[int, dict[str, float]], order: Sequence[str]) -> dict[int, tuple[str, str, float]]:
    """每个行数选中位数最小的读法。差不到 TIE 的算打平，取 order 里靠前的：同一张表永远选同一个。
    返回 行数 -> (选中的, 次快的, 次快的中位数 / 选中的 - 1)；只有一种读法的行数不在里面。"""
    out = {}
    for n, times in sorted(medians.items()):
        if len(times) < 2:
            continue
        best = min(times.values())
        pick = next(v for v in order if v in times and times[v] <= best * (1 + TIE))
        runner = min((v for v in times if v != pick), key=lambda v: (times[v], order.index(v)))
        out[n] = (pick, runner, times[runner] / times[pick] - 1)
    return out
# --8<-- [end:choose]


def measure(ext: ModuleType, rounds: int = ROUNDS) -> dict[int, dict[str, float]]:
    """有两种以上读法可选的行数，各种读法在 SHAPES × LAYERS 上轮流跑 rounds 轮，返回 行数 -> 读法 -> 中位秒数。"""
    from .huge_pages import to_huge_pages

    names, limits = list(ext.variants), list(ext.variant_rows)
    # 设备和 dtype 写明：第一次载入常在 Engine 建模型时（torch.device("meta")、引擎的默认 dtype 之下）
    cpu = {"device": "cpu", "dtype": torch.float32}
    weights = [to_huge_pages(torch.full((o, i), 0.01, **cpu)) for _ in range(LAYERS) for o, i in SHAPES]
    rows = [n for n in range(1, ext.max_rows + 1) if sum(n <= lim for lim in limits) > 1]
    xs = {n: {i: torch.randn(n, i, **cpu) for i in {w.shape[1] for w in weights}} for n in rows}
    times: dict[int, dict[str, list[float]]] = {n: {v: [] for v, lim in zip(names, limits) if n <= lim} for n in rows}

    def once(n: int, v: str) -> float:
        idx, x = names.index(v), xs[n]
        t0 = time.perf_counter()
        for w in weights:
            ext.small_linear(x[w.shape[1]], w, None, idx)
        return time.perf_counter() - t0

    with torch.inference_mode():
        for r in range(rounds + 1):  # 第 0 轮是预热，不记
            for n in rows:
                for v in (list(times[n]) if r % 2 else list(times[n])[::-1]):
                    t = once(n, v)
                    if r:
                        times[n][v].append(t)
    return {n: {v: statistics.median(ts) for v, ts in per.items()} for n, per in times.items()}


def cores() -> int:
    """这个进程能用的核数（和 Engine 定线程数用的同一个数）：负载不小于它就算机器正忙。"""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_load() -> float | None:
    """1 分钟平均负载（测试换掉它）；没有这个数的系统（Windows）是 None，当作不忙。"""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def identity(ext: ModuleType) -> dict[str, object]:
    """缓存的键：CPU 型号、指令集、线程数、库（名字里有源码、编译选项、编译器的哈希）。"""
    info: dict[str, str] = {}
    try:
        head = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
        info = {k.strip(): v.strip() for k, _, v in (s.partition(":") for s in head.splitlines())}
    except OSError:  # 没有 /proc（macOS）：只认 platform
        import platform

        info = {"model name": platform.processor() or platform.machine()}
    cpu = " ".join(info.get(k, "") for k in ("model name", "cpu family", "model", "CPU part")).strip()
    flags = info.get("flags") or info.get("Features", "")
    return {"cpu": cpu, "flags": hashlib.sha1(flags.encode()).hexdigest()[:10], "threads": ext.num_threads(),
            "source": ext.__name__}


def _read(path: Path, say: Callable[[str], None]) -> list[dict]:
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["entries"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise TypeError("entries 不是一列记录")
        return entries
    except (OSError, ValueError, KeyError, TypeError) as e:
        say(f"{path} 坏了（{type(e).__name__}），重新量")
        return []


def _write(path: Path, entries: list[dict]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # 几个进程同时写：各写各的，再原子地换上
    try:
        tmp.write_text(json.dumps({"entries": entries}, ensure_ascii=False, indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # 缓存目录只读：这次量的照用，下次再量
        tmp.unlink(missing_ok=True)


def forced(ext: ModuleType, name: str) -> Plan:
    """MINISGL_KERNEL_VARIANT=name：每个它管得了的行数都用它，别的用第一种（tile）。名字不对就说一行可选的。"""
    names, limits = list(ext.variants), list(ext.variant_rows)
    if name not in names:
        raise ValueError(f"{VARIANT_ENV}={name}：没有这种读法，可选 {'、'.join(names)}")
    lim = limits[names.index(name)]
    table = {n: name if n <= lim else names[0] for n in range(1, ext.max_rows + 1)}
    return Plan(table, how=f"{VARIANT_ENV}={name} 强制", threads=ext.num_threads())


def install(ext: ModuleType, say: Callable[[str], None] = lambda s: print(f"minisgl.kernel：{s}", file=sys.stderr)
            ) -> Plan:
    """定下这个进程里 1~8 行各用哪种读法、写进 C++ 的表：强制的、缓存里的，或者现量。只在载入扩展时调一次。"""
    plan = None
    if name := os.environ.get(VARIANT_ENV):
        try:
            plan = forced(ext, name)
        except ValueError as e:  # 名字打错了：说一行，照常按实测选（不抛 traceback，也不悄悄用别的）
            say(f"{e}；不用它，按实测选")
    if plan is None:
        key, path = identity(ext), Path(ext.__file__).with_name("plan.json")
        entries = _read(path, say)
        mine = next((e for e in entries if e.get("threads") == key["threads"]), None)
        plan = _cached(ext, mine) if mine and all(mine.get(k) == v for k, v in key.items()) else None
        now = machine_load()
        if plan is not None and plan.busy() and (now is None or now < cores()):
            say(f"plan.json 里那份是机器正忙的时候量的（1 分钟平均负载 {plan.load:.1f}），现在闲下来了：重新量")
            plan = None
        elif plan is None:
            if mine:
                diff = "、".join(k for k, v in key.items() if mine.get(k) != v) or "表的格式"
                say(f"plan.json 里 {key['threads']} 个线程的那份不是这台机器这份库的（{diff} 不同），不用它，重新量")
            elif entries:
                say(f"plan.json 里只有 {'、'.join(sorted(str(e.get('threads')) for e in entries))} 个线程的，"
                    f"这次 {key['threads']} 个线程：重新量")
        if plan is None:
            t0 = time.perf_counter()
            picked = choose(measure(ext), list(ext.variants))
            limits = dict(zip(ext.variants, ext.variant_rows))
            table = {n: picked[n][0] if n in picked else next(v for v, lim in limits.items() if n <= lim)
                     for n in range(1, ext.max_rows + 1)}
            plan = Plan(table, {n: (r, m) for n, (_, r, m) in picked.items()}, "实测", time.perf_counter() - t0,
                        key["threads"], now)
            entry = {**key, "table": {str(n): v for n, v in table.items()}, "load": now,
                     "margins": {str(n): list(rm) for n, rm in plan.margins.items()}, "seconds": plan.seconds}
            _write(path, [e for e in entries if e.get("threads") != key["threads"]] + [entry])
            say(plan.line())
    ext.set_plan([list(ext.variants).index(plan.table[n]) for n in range(1, ext.max_rows + 1)])
    return plan


def _cached(ext: ModuleType, entry: dict) -> Plan | None:
    """缓存里的一份；和这份库对不上（读法的名字、行数）就是 None，重新量。"""
    try:
        table = {n: entry["table"][str(n)] for n in range(1, ext.max_rows + 1)}
        margins = {int(n): (str(r), float(m)) for n, (r, m) in entry.get("margins", {}).items()}
        limits = dict(zip(ext.variants, ext.variant_rows))
        if any(v not in limits or n > limits[v] for n, v in table.items()):
            return None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    load = entry.get("load")
    return Plan(table, margins, "缓存", 0.0, int(entry["threads"]),
                float(load) if isinstance(load, (int, float)) else None)
