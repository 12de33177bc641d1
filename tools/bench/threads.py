"""python -m tools.bench.threads：C++ 核的三种编法和核关掉，轮流量第 6 章 Engine 一步 decode
（SmolLM2-135M，bs 1 和 4）。

- c++（Debian 上是 g++）带 OpenMP：并行循环是 at::parallel_for（torch 的 OpenMP 线程池），Linux 上默认就是它；
- clang++ 不带 OpenMP（MINISGL_KERNEL_OPENMP=0）：csrc/include/parallel.h 直接调 torch 载入的 OpenMP 运行库。
  macOS 上 Apple 的 clang 没有 -fopenmp，编出来的就是这一种：在 Linux 上用 clang++ 代替量它；
- c++ 不带 OpenMP：同一条路、g++ 编的代码，把"编译器"和"怎么进并行区"两件事分开；
- 核关掉（MINISGL_KERNEL=off）：各层全用 PyTorch 的算子。

一种编法一个进程（一个进程只能选一份核）：每轮每种各起一个新进程，轮流跑 --rounds 轮，每格取最快的一轮，
再写出同一轮里紧挨着量的比值。表写进 docs/snippets/kernel_threads.md（附录和首页的 macOS 一行引用它）。

    .venv/bin/python -m tools.bench.threads [--rounds 4] [--steps 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone

from tools.bench.machine import machine_line
from tools.manifest import ROOT
from tools.models.find import SMOLLM2, has_weights

SNIPPET = ROOT / "docs" / "snippets" / "kernel_threads.md"
COMMAND = ".venv/bin/python -m tools.bench.threads"
BATCH_SIZES = (1, 4)
# 行名 -> 环境变量（CXX=c++ 和没设 CXX 是同一份缓存）
VARIANTS = {"c++（g++），带 OpenMP（at::parallel_for）": {"CXX": "c++", "MINISGL_KERNEL_OPENMP": "1"},
            "clang++，不带 OpenMP（parallel.h 调 torch 的 OpenMP 运行库；Mac 上是这一种）":
                {"CXX": "clang++", "MINISGL_KERNEL_OPENMP": "0"},
            "c++（g++），不带 OpenMP（同一条路：把编译器和进并行区的办法分开看）":
                {"CXX": "c++", "MINISGL_KERNEL_OPENMP": "0"},
            "核关掉（MINISGL_KERNEL=off，PyTorch 的算子）": {"MINISGL_KERNEL": "off"}}


def child(steps: int) -> dict[int, float]:
    """在这个进程的环境下（选哪份核）加载 Engine，量 bs 1 和 4 的一步 decode（秒），各取 2 次里快的。"""
    from tools.manifest import use_checkpoint

    use_checkpoint("ch6_engine_sampler")
    from transformers import AutoTokenizer

    from minisgl import kernel
    from tools.bench.timing import PROMPTS, load_engine, time_engine

    kernel.extension()  # 编译（第一次）和那一行原因都在计时之外
    engine, tok = load_engine(str(SMOLLM2)), AutoTokenizer.from_pretrained(str(SMOLLM2))
    time_engine(engine, tok, PROMPTS, 4)  # 预热
    out = {bs: min(time_engine(engine, tok, PROMPTS[:bs], steps)[1] for _ in range(2)) for bs in BATCH_SIZES}
    engine.shutdown()
    return out


def run_variant(env: dict[str, str], steps: int) -> dict[int, float]:
    res = subprocess.run([sys.executable, "-m", "tools.bench.threads", "--child", "--steps", str(steps)],
                         env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"错误：{env} 的那一份没跑完：{(res.stderr.strip().splitlines() or ['没有输出'])[-1]}")
    return {int(k): v for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}


def render(best: dict[str, dict[int, float]], pairs: dict[int, list[float]], rounds: int, load: str) -> str:
    base = next(iter(best.values()))
    busy = "（机器上同时还有别的进程）" if float(load) >= 1 else ""  # 2 核上负载到 1 就有别人在抢核
    head = ["核的编法", *(f"decode bs={bs}（ms/步）" for bs in BATCH_SIZES), "对带 OpenMP 的（bs=1 / bs=4）"]
    lines = [f"命令：`{COMMAND}`；日期：{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC；{machine_line()}；"
             f"SmolLM2-135M，fp32。开始时 1 分钟平均负载 {load}{busy}。", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, t in best.items():
        ms = [round(t[bs] * 1e3, 1) for bs in BATCH_SIZES]
        ratio = " / ".join(f"{m / round(base[bs] * 1e3, 1):.2f}" for m, bs in zip(ms, BATCH_SIZES))
        lines.append("| " + " | ".join([name, *(f"{m:.1f}" for m in ms), ratio]) + " |")
    shown = {bs: [round(x, 2) for x in v] for bs, v in pairs.items()}  # 中位数用写出来的数算：读者能照着核对
    parts = [f"bs={bs} 各轮是 {'、'.join(f'{x:.2f}' for x in v)}，中位数 {statistics.median(v):.2f}"
             for bs, v in shown.items()]
    lines += ["", f"{len(best)} 种轮流跑 {rounds} 轮，每轮每种一个新进程，每格取最快的一轮"
              f"（表里的比值用表里的毫秒数算）。同一轮里紧挨着量的 clang++ / g++ 之比：{'；'.join(parts)}。"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=16, help="decode 步数")
    ap.add_argument("--out", default=str(SNIPPET), help="写 markdown 表的位置（空字符串 = 不写）")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.steps)))
        return
    if not has_weights(SMOLLM2):
        raise SystemExit(f"错误：没有 {SMOLLM2}：先运行 python -m tools.models.make_smollm2")
    load = f"{os.getloadavg()[0]:.1f}"
    best: dict[str, dict[int, float]] = {}
    pairs: dict[int, list[float]] = {bs: [] for bs in BATCH_SIZES}
    for r in range(args.rounds):
        got = {name: run_variant(env, args.steps) for name, env in VARIANTS.items()}
        g, c = list(got.values())[:2]
        for bs in BATCH_SIZES:
            pairs[bs].append(c[bs] / g[bs])
        for name, t in got.items():
            best[name] = {bs: min(t[bs], best.get(name, t)[bs]) for bs in BATCH_SIZES}
        ms = ["/".join(f"{t[bs] * 1e3:.1f}" for bs in BATCH_SIZES) for t in got.values()]
        print(f"第 {r + 1} 轮（ms/步，bs 1/4）：" + "；".join(ms), flush=True)
    text = render(best, pairs, args.rounds, load)
    print(text)
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(text, encoding="utf-8")
        print(f"写进了 {args.out}")


if __name__ == "__main__":
    main()
