"""线性层的核的小基准：fp32 的矩阵乘在 decode 的几行（读权重）和 prefill 的几十上百行（算）上各有多快
（附录"CPU 上的矩阵乘"引用它写的表）。

    .venv/bin/python -m tools.bench.kernels             # 8 层 Qwen3-0.6B 的线性层（480 MiB，远大于 L3），1~256 行；
                                                        # 表写进 docs/snippets/bench_kernels.md
    .venv/bin/python -m tools.bench.kernels --shapes smollm2   # 30 层 SmolLM2-135M 的（每行只有 576 个 float）；
                                                               # 表写进 docs/snippets/bench_kernels_smollm2.md
    .venv/bin/python -m tools.bench.kernels --layers 28 --rows 1 4

并排五列：F.linear（MKL 的 sgemm）、第 6 章 minisgl.kernel 的 linear（1~8 行 small_linear，更多行 gemm）、
同一个核读放进 2 MB 大页的同一份权重（kernel.to_huge_pages，Engine 加载时就这么放），和两种只读不算的读法：
sum()、C++ 的 stream_read 把大页上的那份读一遍（读带宽的参照：矩阵乘快不过把权重读一遍）。
每格是毫秒、GFLOP/s（2·行数·权重个数 / 秒）和 GB/s（权重字节数 / 秒）。几种轮流测，每项取 --repeat 轮中最快的一轮。
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

from tools.bench.machine import kernel_summary, machine_line
from tools.bench.memory import huge_page_line
from tools.manifest import ROOT, use_checkpoint

use_checkpoint("ch6_engine_sampler")  # 量的是第 6 章 minisgl.kernel 的做法
from minisgl import kernel  # noqa: E402

SNIPPET = ROOT / "docs" / "snippets" / "bench_kernels.md"  # 附录引用的表
COMMAND = ".venv/bin/python -m tools.bench.kernels"
# 一层的 qkv、o、gate_up、down（合并后的形状），和默认测几层；每种形状一张表（附录引用）、一条重新生成的命令
SHAPES = {"qwen3-0.6b": [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)],
          "smollm2": [(960, 576), (576, 576), (3072, 576), (576, 1536)]}
LAYERS = {"qwen3-0.6b": 8, "smollm2": 30}
SNIPPETS = {"qwen3-0.6b": SNIPPET, "smollm2": SNIPPET.with_name("bench_kernels_smollm2.md")}
COMMANDS = {"qwen3-0.6b": COMMAND, "smollm2": f"{COMMAND} --shapes smollm2"}
COLUMNS = ["行数", "F.linear（MKL sgemm）", "minisgl.kernel（C++）", "minisgl.kernel，权重在 2 MB 大页上",
           "sum() 读大页上的那份", "stream_read 读大页上的那份"]
READ_ONLY = COLUMNS[-2:]  # 只读不算：没有 GFLOP/s
ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def best_seconds(kinds: dict, rows: int, repeat: int) -> dict[str, float]:
    """几种做法轮流各跑一遍权重，repeat 轮取各自最快的一轮（第一轮是预热）：机器忙的那一阵摊到每种做法头上。"""
    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in kinds[COLUMNS[1]][1]}
    best = dict.fromkeys(kinds, float("inf"))
    for r in range(repeat + 1):
        for name, (fn, weights) in kinds.items():
            t0 = time.perf_counter()
            for w in weights:
                fn(xs[w.shape[1]], w)
            if r:
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="qwen3-0.6b", help="哪个模型的线性层形状")
    ap.add_argument("--layers", type=int, help="测几层（默认 Qwen3-0.6B 8 层、SmolLM2 30 层，都远大于 L3）")
    ap.add_argument("--rows", type=int, nargs="+", default=ROWS)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default=None,
                    help="把表写成 markdown（附录的两条命令默认写到 docs/snippets/ 里它们的表）")
    args = ap.parse_args()
    ext = kernel.extension()
    if ext is None:
        raise SystemExit("错误：minisgl.kernel 的 C++ 核用不了（原因见上一行）：只剩 F.linear，没什么可比")
    if min(args.rows) < 1:
        raise SystemExit(f"错误：--rows 要是正整数，给了 {min(args.rows)}")
    default_run = sys.argv[1:] == COMMANDS[args.shapes].split()[3:]  # 正是附录那条命令：写它的表
    out = args.out if args.out is not None else (str(SNIPPETS[args.shapes]) if default_run else "")
    layers = args.layers or LAYERS[args.shapes]
    torch.manual_seed(0)
    weights = [torch.randn(o, i) * 0.02 for _ in range(layers) for o, i in SHAPES[args.shapes]]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    huge = [kernel.to_huge_pages(w) for w in weights]  # 同样的值，放进 2 MB 大页（系统没有 THP 时就是同一份）
    kinds = {COLUMNS[1]: (F.linear, weights), COLUMNS[2]: (ext.linear, weights),
             COLUMNS[3]: (ext.linear, huge), COLUMNS[4]: (lambda x, w: w.sum(), huge),
             COLUMNS[5]: (lambda x, w: ext.stream_read(w), huge)}
    command = COMMANDS[args.shapes] if default_run else " ".join(["python", "-m", "tools.bench.kernels"] + sys.argv[1:])
    per_layer = "、".join(f"{o}×{i}" for o, i in SHAPES[args.shapes])
    lines = [f"<!-- 由 tools/bench/kernels.py 生成，不要手改；重新生成：{COMMANDS[args.shapes]} -->", "",
             f"命令：`{command}`<br>",
             f"日期：{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}；{machine_line()}<br>",
             f"minisgl.kernel：{kernel_summary()}<br>",
             f"{args.shapes} 的 {layers} 层线性层（每层 {per_layer}），fp32 权重 {nbytes / 2**20:.0f} MiB；"
             f"后三列读的那份：{huge_page_line(huge)}<br>",
             (f"几种做法轮流测，每项 {args.repeat} 轮取最快"
              "（一次运行；这台机器和别人共用，绝对值有起伏，看同一行里的比例）"), "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    print("\n".join(lines[2:]), flush=True)
    with torch.inference_mode():
        for rows in args.rows:
            best = best_seconds(kinds, rows, args.repeat)
            flops = 2 * rows * nbytes / 4
            cells = [f"{s * 1e3:.1f} ms，{flops / s / 1e9:.0f} GFLOP/s，{nbytes / s / 1e9:.1f} GB/s"
                     if name not in READ_ONLY else f"{s * 1e3:.1f} ms，{nbytes / s / 1e9:.1f} GB/s"
                     for name, s in best.items()]
            lines.append(f"| {rows} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    if out:
        Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"已写入 {out}")


if __name__ == "__main__":
    main()
