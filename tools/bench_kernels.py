"""第 2 章的小基准：只测线性层的核，看 fp32 的三种做法读权重有多快。

    .venv/bin/python tools/bench_kernels.py             # 8 层 Qwen3-0.6B 的线性层（480 MiB，远大于 L3），1/4/16 行；
                                                        # 表写进 docs/snippets/bench_kernels.md（第 2 章页面引用它）
    .venv/bin/python tools/bench_kernels.py --layers 28 --rows 1 4
    .venv/bin/python tools/bench_kernels.py --pack-rows 1 4 8   # 比较重排时告诉 oneDNN 的几种行数

三种做法：F.linear（MKL 的 sgemm）、oneDNN 直接吃普通布局的权重、oneDNN 吃加载时重排过的权重
（第 2 章 layers/linear.py 的 prepack_weight，引擎用的就是它）。每项取 --repeat 次中最快的一次。
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ch6_engine_sampler"))
sys.path.insert(0, str(ROOT / "tools"))
import minisgl.layers.linear as linear_mod  # noqa: E402
from bench import cpu_name  # noqa: E402

SNIPPET = ROOT / "docs" / "snippets" / "bench_kernels.md"  # 第 2 章页面引用的表
COMMAND = ".venv/bin/python tools/bench_kernels.py"

SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]  # Qwen3-0.6B 一层：qkv、o、gate_up、down


def onednn_plain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")


def best_seconds(fn, weights: list[torch.Tensor], rows: int, repeat: int) -> float:
    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
    best = float("inf")
    for _ in range(repeat + 1):  # 第一次是预热
        t0 = time.perf_counter()
        for w in weights:
            fn(xs[w.shape[1]], w)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--pack-rows", type=int, nargs="+", default=[linear_mod._PACK_ROWS],
                    help="重排时按几行挑布局（默认是 linear.py 里的 _PACK_ROWS）；给几个就比几个")
    ap.add_argument("--out", default=None,
                    help=f"把表写成 markdown（不带参数的默认运行写到 {SNIPPET.relative_to(ROOT)}）")
    args = ap.parse_args()
    default_run = sys.argv[1:] == []
    out = args.out if args.out is not None else (str(SNIPPET) if default_run else "")
    torch.manual_seed(0)
    plain = [torch.randn(o, i) * 0.02 for _ in range(args.layers) for o, i in SHAPES]
    if not linear_mod._ONEDNN:
        raise SystemExit("这个 torch 没有 oneDNN 的 linear / 权重重排算子：只有 F.linear 可测")
    nbytes = sum(w.numel() * w.element_size() for w in plain)
    default_pack = linear_mod._PACK_ROWS
    kinds = {"F.linear（MKL sgemm）": (F.linear, plain, default_pack),
             "oneDNN，普通布局": (onednn_plain, plain, default_pack)}
    for n in args.pack_rows:
        linear_mod._PACK_ROWS = n  # prepack_weight 按它挑布局
        packed = [linear_mod.prepack_weight(w) for w in plain]
        kinds[f"oneDNN，加载时重排（按 {n} 行）"] = (linear_mod.linear, packed, n)
    lines = [f"<!-- 由 tools/bench_kernels.py 生成，不要手改；重新生成：{COMMAND} -->", "",
             f"命令：`{COMMAND if default_run else ' '.join(['python', 'tools/bench_kernels.py'] + sys.argv[1:])}`<br>",
             f"日期：{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}；机器：{cpu_name()}，"
             f"torch {torch.__version__}，{torch.get_num_threads()} 个线程<br>",
             f"{args.layers} 层线性层，fp32 权重 {nbytes / 2**20:.0f} MiB；每项 {args.repeat} 次取最快（一次运行）", "",
             "| 行数 | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    print("\n".join(lines[2:-2]) + "\n")
    print(lines[-2] + "\n" + lines[-1])
    for rows in args.rows:
        cells = []
        for fn, weights, pack in kinds.values():
            linear_mod._PACK_ROWS = pack  # linear() 按它补行
            s = best_seconds(fn, weights, rows, args.repeat)
            cells.append(f"{s * 1e3:.1f} ms，{nbytes / s / 1e9:.1f} GB/s")
        lines.append(f"| {rows} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    linear_mod._PACK_ROWS = default_pack
    if out:
        Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"已写入 {out}")


if __name__ == "__main__":
    main()
