"""线性层的核的小基准：fp32 的几种做法读权重有多快（附录"CPU 上的矩阵乘"引用它写的表）。

    .venv/bin/python -m tools.bench_kernels             # 8 层 Qwen3-0.6B 的线性层（480 MiB，远大于 L3），1/4/16 行；
                                                        # 表写进 docs/snippets/bench_kernels.md
    .venv/bin/python -m tools.bench_kernels --layers 28 --rows 1 4
    .venv/bin/python -m tools.bench_kernels --pack-rows 1 4 8   # 比较重排时告诉 oneDNN 的几种行数

几种做法：F.linear（MKL 的 sgemm）、oneDNN 直接吃普通布局的权重、oneDNN 吃加载时按 r 行重排过的权重
（第 6 章 minisgl/kernel 的 pack）、权重按输出切成 k 块交给一次 torch.bmm（k = 线程数和它的两倍）。
几种做法轮流测，每项取 --repeat 轮中最快的一轮。
最后用 minisgl.kernel 自己的规则在这台机器上量一遍，写出它给每种形状选了什么——引擎加载后做的就是这一步。
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

from tools.bench import machine_line
from tools.manifest import ROOT, use_checkpoint

use_checkpoint("ch6_engine_sampler")  # 量的是第 6 章 minisgl.kernel 的做法
from minisgl import kernel  # noqa: E402

SNIPPET = ROOT / "docs" / "snippets" / "bench_kernels.md"  # 附录引用的表
COMMAND = ".venv/bin/python -m tools.bench_kernels"
PACK_ROWS = [1, 4]  # 默认比较的重排行数：decode 的 batch 1 和里程碑的 batch 4

SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]  # Qwen3-0.6B 一层：qkv、o、gate_up、down


def columns(pack_rows: list[int], blocks: list[int]) -> list[str]:
    packed = [f"oneDNN，加载时重排（按 {r} 行）" for r in pack_rows]
    return ["行数", "F.linear（MKL sgemm）", "oneDNN，普通布局", *packed, *(f"bmm，切 {k} 块" for k in blocks)]


def best_seconds(kinds: dict, rows: int, repeat: int) -> dict[str, float]:
    """几种做法轮流各跑一遍权重，repeat 轮取各自最快的一轮（第一轮是预热）：机器忙的那一阵摊到每种做法头上。"""
    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for _, ws in kinds.values() for w in ws}
    best = dict.fromkeys(kinds, float("inf"))
    for r in range(repeat + 1):
        for name, (fn, weights) in kinds.items():
            t0 = time.perf_counter()
            for w in weights:
                fn(xs[w.shape[1]], w)
            if r:
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


class _Owner:
    def __init__(self, w: torch.Tensor) -> None:
        self.weight = w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--pack-rows", type=int, nargs="+", default=PACK_ROWS,
                    help="重排时按几行挑布局；给几个就比几个")
    ap.add_argument("--out", default=None,
                    help=f"把表写成 markdown（不带参数的默认运行写到 {SNIPPET.relative_to(ROOT)}）")
    args = ap.parse_args()
    default_run = sys.argv[1:] == []
    out = args.out if args.out is not None else (str(SNIPPET) if default_run else "")
    torch.manual_seed(0)
    plain = [torch.randn(o, i) * 0.02 for _ in range(args.layers) for o, i in SHAPES]
    if not kernel.ONEDNN:
        raise SystemExit("这个 torch 没有 oneDNN 的 linear / 权重重排算子：只有 F.linear 可测")
    nbytes = sum(w.numel() * w.element_size() for w in plain)
    blocks = sorted(set.intersection(*(set(kernel.bmm_blocks(o)) for o, _ in SHAPES)))  # 每种形状都能切的块数
    cols = columns(args.pack_rows, blocks)
    kinds = {cols[1]: (F.linear, plain), cols[2]: (lambda x, w: kernel.run_kernel("onednn", x, w), plain)}
    for col, r in zip(cols[3:], args.pack_rows):
        kinds[col] = (kernel.linear, [kernel.pack(w, r) for w in plain])
    for col, k in zip(cols[3 + len(args.pack_rows):], blocks):
        kinds[col] = (lambda x, w, name=f"bmm/{k}": kernel.run_kernel(name, x, w), plain)
    command = COMMAND if default_run else " ".join(["python", "-m", "tools.bench_kernels"] + sys.argv[1:])
    lines = [f"<!-- 由 tools/bench_kernels.py 生成，不要手改；重新生成：{COMMAND} -->", "",
             f"命令：`{command}`<br>",
             f"日期：{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}；{machine_line()}<br>",
             f"{args.layers} 层线性层，fp32 权重 {nbytes / 2**20:.0f} MiB；几种做法轮流测，每项 {args.repeat} 轮取最快"
             "（一次运行；这台机器和别人共用，绝对值有起伏，看同一行里的比例）", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    print("\n".join(lines[2:]), flush=True)
    for rows in args.rows:
        best = best_seconds(kinds, rows, args.repeat)
        cells = [f"{s * 1e3:.1f} ms，{nbytes / s / 1e9:.1f} GB/s" for s in best.values()]
        lines.append(f"| {rows} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    del kinds
    kernel.reset()
    t0 = time.perf_counter()
    layouts = kernel.prepare_linear_weights([_Owner(w) for w in plain], rows=args.pack_rows)
    took = time.perf_counter() - t0
    chosen = "；".join(f"{o}×{i} → {layouts.get((o, i), 'F.linear')}" for o, i in SHAPES)
    lines += ["", f"minisgl.kernel 在同一次运行里按 {args.pack_rows} 行量了一遍（用时 {took:.1f} 秒），"
                  f"选的是：{chosen}"]
    print(lines[-1])
    if out:
        Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"已写入 {out}")


if __name__ == "__main__":
    main()
