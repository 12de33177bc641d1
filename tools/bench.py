"""在同一个进程里并排测 decode 每一步的耗时：内存带宽下限、第 0 步骨架、HF transformers、我们的 Engine。

    python tools/bench.py                              # 有 models/Qwen3-0.6B 就用它，否则用离线小模型
    python tools/bench.py --model models/Qwen3-0.6B --steps 16 --repeat 3
    python tools/bench.py --random-qwen3-0.6b          # 没有真权重：用同样形状的随机权重，访存量一样

decode 是访存密集的：每一步都要把全部权重从内存读一遍。下限 = 权重字节数 / 实测的内存读带宽。
batch 里多几个请求，读权重的代价几乎不变，所以好的实现 bs=4 每一步只比 bs=1 慢一点。
速度只在这里测、只在这里报，测试从不断言耗时。
"""

from __future__ import annotations

import argparse
import contextlib
import io
import runpy
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ch6_engine_sampler"))
sys.path.insert(0, str(ROOT / "tools"))

sys.path.insert(0, str(ROOT / "ch6_engine_sampler" / "examples"))
from stage1_milestone import PROMPTS, Milestone  # noqa: E402


def best(fn, repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def bandwidth_floor_ms(weight_bytes: int) -> tuple[float, float]:
    """用 sum() 读一块大于缓存的缓冲区，量出内存读带宽（GB/s），再换算成读一遍权重要多少毫秒。"""
    buf = torch.ones(max(weight_bytes, 256 << 20) // 4)
    buf.sum()
    secs = best(lambda: _timed(buf.sum), 5)
    gbps = buf.numel() * 4 / secs / 1e9
    return gbps, weight_bytes / (gbps * 1e9) * 1e3


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def ours(path: str, bs: int, steps: int) -> float:
    """第 6 章的 Engine，batch 的字段由里程碑脚本的 step() 手工填。返回 decode 每步的秒数。"""
    milestone = Milestone(path, page_size=1)
    try:
        return milestone.generate(PROMPTS[:bs], steps + 1)[2]
    finally:
        milestone.engine.shutdown()


def skeleton(path: str, steps: int) -> float:
    """第 0 步：runpy 跑一遍 skeleton.py 的 main（顺带加载权重），再直接调它的 forward 计时。"""
    argv, sys.argv = sys.argv, ["skeleton.py", "--model", path, "--max-new-tokens", "1", "--json"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            g = runpy.run_path(str(ROOT / "step0_skeleton" / "skeleton.py"), run_name="__main__")
    finally:
        sys.argv = argv
    from transformers import AutoTokenizer

    ids = torch.tensor(AutoTokenizer.from_pretrained(path)(PROMPTS[0]).input_ids)
    kv = [None] * g["cfg"]["num_hidden_layers"]
    with torch.inference_mode():
        logits = g["forward"](ids, torch.arange(len(ids)), kv)
        pos = torch.tensor([len(ids)])
        t0 = time.perf_counter()
        for _ in range(steps):
            logits = g["forward"](logits.argmax()[None], pos, kv)
            pos = pos + 1
    return (time.perf_counter() - t0) / steps


def hf(model, tok, bs: int, steps: int) -> float:
    """HF generate：(生成 steps+1 个的时间 - 生成 1 个的时间) / steps 就是 decode 每步的时间。"""
    tok.padding_side = "left"
    enc = tok(PROMPTS[:bs], return_tensors="pt", padding=True)

    def run(n: int) -> float:
        return _timed(lambda: model.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False))

    with torch.inference_mode():
        run(2)
        return (run(steps + 1) - run(1)) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="每项测几次取最快的一次")
    ap.add_argument("--random-qwen3-0.6b", dest="random_qwen3_06b", action="store_true",
                    help="没有真权重时：写一个 Qwen3-0.6B 形状的随机权重检查点（约 2.4 GB）来测")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = args.model
    if args.random_qwen3_06b:
        from make_tiny_models import make_random_qwen3_06b

        path = str(make_random_qwen3_06b())
        print(f"Qwen3-0.6B 形状的随机权重：{path}（输出是乱码，但每步读的权重和真模型一样多）\n")
    elif path is None:
        real = ROOT / "models" / "Qwen3-0.6B"
        if list(real.glob("*.safetensors")):
            path = str(real)
        else:
            from make_tiny_models import make_all

            path = str(make_all(names=["qwen3-tied"])["qwen3-tied"])
            print(f"没有 {real}：用离线小模型 {path}。它太小，数字主要是 Python 开销，不反映访存\n")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # 绑定的词嵌入只算一次
    gbps, floor = bandwidth_floor_ms(weight_bytes)
    rows = [("内存带宽下限", floor / 1e3, floor / 1e3)]
    rows.append(("第 0 步骨架", best(lambda: skeleton(path, args.steps), args.repeat), None))
    rows.append(("HF transformers", *(best(lambda: hf(model, tok, bs, args.steps), args.repeat) for bs in (1, 4))))
    rows.append(("我们（第 6 章 Engine）",
                 *(best(lambda: ours(path, bs, args.steps), args.repeat) for bs in (1, 4))))
    print(f"模型 {path}：权重 {weight_bytes / 2**20:.1f} MiB；内存读带宽 {gbps:.1f} GB/s；"
          f"{torch.get_num_threads()} 个线程；decode {args.steps} 步，每项取 {args.repeat} 次中最快的")
    print(f"{'':24}{'bs=1 ms/步':>12}{'bs=4 ms/步':>12}{'bs=4 tokens/s':>15}{'bs=4 / bs=1':>13}")
    for name, t1, t4 in rows:
        if t4 is None:
            print(f"{name:24}{t1 * 1e3:12.2f}{'—':>12}{'—':>15}{'—':>13}")
        else:
            print(f"{name:24}{t1 * 1e3:12.2f}{t4 * 1e3:12.2f}{4 / t4:15.1f}{t4 / t1:13.2f}")


if __name__ == "__main__":
    main()
