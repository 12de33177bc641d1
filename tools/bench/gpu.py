"""python -m tools.bench.gpu：有 CUDA 的机器上，在同一个进程里并排测第 6 章的 Engine（录 CUDA 图和
不录）、HF transformers（eager）和这块卡的访存下限，写进 docs/snippets/bench_cuda.md
（书里"在哪些机器上跑过"的 GPU 一行引用它）。

    python -m tools.bench.gpu --random-qwen3-0.6b          # Qwen3-0.6B 形状的随机权重（约 2.4 GB，访存量和真模型一样）
    python -m tools.bench.gpu --model DIR --bs 1 4 16 --steps 31

下限 = 权重字节数 / 这块卡上设备到设备拷贝的速度（读 + 写的字节数 / 时间）：decode 一步至少要把权重读一遍。
Engine 和 HF 轮流测 --repeat 轮，每项留最快的一轮。没有 CUDA 时说一行就退出（CPU 的表是 python -m tools.bench）。
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from tools.manifest import ROOT, use_checkpoint

SNIPPET = ROOT / "docs" / "snippets" / "bench_cuda.md"
TEXT = "The capital of France is"


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30, rounds: int = 10) -> float:
    """设备到设备拷贝的速度（字节/秒，读和写都算）：最快的一轮。"""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / best


def time_engine_decode(path: str, bs: int, steps: int, graphs: bool) -> float:
    """Engine 一步 decode（调度器一步的全部活：填 batch、前向 + 采样、写回，含同步）的秒数。
    graphs：decode 重放 CUDA 图（录图在建 Engine 时，不计时），否则 cuda_graph_bs=[] 逐个算子地跑。"""
    from minisgl.distributed import DistributedInfo
    from minisgl.engine import Engine, EngineConfig
    from minisgl.utils import load_tokenizer
    from tools.bench.timing import engine_requests

    engine = Engine(EngineConfig(model_path=path, tp_info=DistributedInfo(0, 1), dtype=torch.float32,
                                 max_running_req=bs, num_page_override=bs * (steps + 64),
                                 max_seq_len_override=steps + 64, cuda_graph_bs=None if graphs else []))
    try:
        tok = load_tokenizer(path)
        one_step = engine_requests(engine, tok, [TEXT] * bs, steps + 1)
        one_step("prefill")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            one_step("decode")
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps
    finally:
        engine.shutdown()


def time_hf_decode(model, tok, bs: int, steps: int) -> float:
    """HF generate（eager、贪心）：(生成 steps+1 个 - 生成 1 个) / steps。"""
    enc = tok([TEXT] * bs, return_tensors="pt").to(model.device)

    def run(n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    with torch.inference_mode():
        return (run(steps + 1) - run(1)) / steps


def render(gpu: str, weights: int, bandwidth: float, engine: dict[int, float], eager: dict[int, float],
           hf: dict[int, float], steps: int) -> str:
    """markdown 表：每个 batch 大小一列，ms/步；下限一行对所有列都一样。"""
    cols = sorted(engine)
    floor_ms = weights / bandwidth * 1000
    lines = [f"*{gpu}；fp32 权重 {weights / 2**30:.2f} GiB；{steps} 步 decode，每项最快的一轮；"
             f"设备到设备拷贝 {bandwidth / 1e12:.2f} TB/s（读 + 写）*", "",
             "| decode ms/步 | " + " | ".join(f"bs {b}" for b in cols) + " |",
             "|---|" + "---|" * len(cols),
             "| 第 6 章的 Engine，CUDA 图 | " + " | ".join(f"{engine[b] * 1000:.1f}" for b in cols) + " |",
             "| 第 6 章的 Engine，不录图 | " + " | ".join(f"{eager[b] * 1000:.1f}" for b in cols) + " |",
             "| HF transformers（eager） | " + " | ".join(f"{hf[b] * 1000:.1f}" for b in cols) + " |",
             "| 下限：权重读一遍 | " + " | ".join(f"{floor_ms:.2f}" for _ in cols) + " |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="模型目录")
    ap.add_argument("--random-qwen3-0.6b", dest="random", action="store_true", help="Qwen3-0.6B 形状的随机权重")
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--steps", type=int, default=31)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(SNIPPET), help="写 markdown 表的位置（空字符串 = 不写）")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("错误：这台机器上的 torch 看不到 CUDA：GPU 的表要在有 GPU 的机器上测（CPU 的表：python -m tools.bench）")
        return 2
    if not args.model and not args.random:
        print("错误：给 --model DIR 或 --random-qwen3-0.6b")
        return 2
    use_checkpoint("ch6")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tools.models.make_tiny_models import make_random_qwen3_06b

    path = str(make_random_qwen3_06b()) if args.random else args.model
    device = torch.device("cuda:0")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    weights = sum(p.numel() * p.element_size() for p in hf.parameters())
    ours: dict[int, float] = {}
    eager: dict[int, float] = {}
    theirs: dict[int, float] = {}
    for _ in range(args.repeat):  # 轮流测：几项摊到同样的噪声
        for bs in args.bs:
            ours[bs] = min(ours.get(bs, float("inf")), time_engine_decode(path, bs, args.steps, graphs=True))
            eager[bs] = min(eager.get(bs, float("inf")), time_engine_decode(path, bs, args.steps, graphs=False))
            theirs[bs] = min(theirs.get(bs, float("inf")), time_hf_decode(hf, tok, bs, args.steps))
    props = torch.cuda.get_device_properties(device)
    gpu = (f"{props.name}（{props.total_memory / 2**30:.0f} GiB），torch {torch.__version__}，"
           f"{datetime.now(timezone.utc):%Y-%m-%d}")
    text = render(gpu, weights, copy_bandwidth(device), ours, eager, theirs, args.steps)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
