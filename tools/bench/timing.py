"""计时：第 0 步骨架、HF transformers、第 6 章的 Engine。都返回 (prefill 秒, decode 每步秒)，几个实现轮流测时
每项留最快的一轮（Timing.keep_best）。调用方已经 use_checkpoint 到第 6 章。"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tools.manifest import ROOT

PROMPTS = ["The capital of France is", "List three prime numbers:", "def fibonacci(n):", "Once upon a time,"]
MAX_SEQ_LEN = 256  # 一个请求最多几个位置（和里程碑一样）
PREFILL_TOKENS = 32  # prefill 那两列：1 个、4 个这么长的提示词（和 llama.cpp 的 -p 32、-p 128 比）
TEXT = ("Large language models generate text one token at a time. Serving many users at once means batching "
        "their requests, keeping each request's key and value cache in pages, and reading the weights once per "
        "step for the whole batch. "
        "大模型一次生成一个 token：同时服务很多人，就要把请求攒成一批，每个请求的 KV 放进分页的池子里。")


@dataclass
class Timing:
    """一个实现的结果（秒），按 batch 大小；None = 做不到（骨架不能批处理）或不适用。"""

    decode: dict[int, float | None] = field(default_factory=dict)
    prefill: dict[int, float | None] = field(default_factory=dict)

    def keep_best(self, kind: str, bs: int, seconds: float) -> None:
        table = getattr(self, kind)
        table[bs] = seconds if table.get(bs) is None else min(table[bs], seconds)

    def keep(self, bs: int, prefill_decode: tuple[float, float]) -> None:
        """一轮的 (prefill 秒, decode 每步秒)：各自留最快的。"""
        self.keep_best("prefill", bs, prefill_decode[0])
        self.keep_best("decode", bs, prefill_decode[1])


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def load_engine(path: str):
    """第 6 章的 Engine：fp32、page_size=1、最多 4 个请求，和里程碑的设置一样。"""
    from minisgl.distributed import DistributedInfo
    from minisgl.engine import Engine, EngineConfig

    return Engine(EngineConfig(model_path=path, tp_info=DistributedInfo(0, 1), dtype=torch.float32,
                               max_running_req=4, page_size=1, num_page_override=1024,
                               max_seq_len_override=MAX_SEQ_LEN))


def prefill_ids(tok, bs: int, n: int = PREFILL_TOKENS) -> list[list[int]]:
    """bs 个各 n 个 token 的提示词（同一段文字接着往下切，每个都不一样）。"""
    ids = tok(TEXT).input_ids
    ids = (ids * (bs * n // len(ids) + 1))[:bs * n]
    return [ids[i * n:(i + 1) * n] for i in range(bs)]


def engine_requests(engine, tok, prompts: list[str], n: int) -> Callable[[str], object]:
    """像第 6 章的 generate.py 那样收下请求（TableManager、CacheManager、add_req），返回做一步的函数：
    就是 generate.py 的 step（prepare_batch → forward_batch → process_output），在 inference_mode 里跑。"""
    from generate import step  # 第 6 章检查点的 generate.py（use_checkpoint 把它的目录放在了 sys.path 最前面）
    from minisgl.core import SamplingParams
    from minisgl.scheduler import CacheManager, TableManager, add_req

    with torch.inference_mode():
        table = TableManager(engine.config.max_running_req, engine.page_table)
        cache = CacheManager(engine.num_pages, engine.config.page_size, engine.page_table)
        reqs = [add_req(engine, table, p if isinstance(p, list) else tok(p).input_ids, SamplingParams(max_tokens=n),
                        uid) for uid, p in enumerate(prompts)]

    def one_step(phase: str) -> object:
        with torch.inference_mode():
            return step(engine, table, cache, reqs, phase)

    return one_step


def time_engine(engine, tok, prompts: list[str], n: int) -> tuple[float, float]:
    """prefill + (n-1) 步 decode；调度器一步的全部活（填 batch、前向 + 采样、写回）都算在步里。"""
    one_step = engine_requests(engine, tok, prompts, n)
    times = [_timed(lambda: one_step(phase)) for phase in ["prefill"] + ["decode"] * (n - 1)]
    return times[0], sum(times[1:]) / (n - 1)


def time_engine_prefill(engine, ids: list[list[int]]) -> float:
    """只有 prefill 一步（提示词是 token id）：调度器一步的全部活都算在里面。"""
    one_step = engine_requests(engine, None, ids, 1)
    return _timed(lambda: one_step("prefill"))


def time_hf_prefill(model, ids: list[list[int]]) -> float:
    """HF generate 生成 1 个 token：一次 prefill（提示词一样长，不用补齐）。"""
    t = torch.tensor(ids)
    with torch.inference_mode():
        return _timed(lambda: model.generate(input_ids=t, attention_mask=torch.ones_like(t), max_new_tokens=1,
                                             min_new_tokens=1, do_sample=False))


def time_skeleton_prefill(g: dict, ids: list[int]) -> float:
    kv = [None] * g["cfg"]["num_hidden_layers"]
    with torch.inference_mode():
        return _timed(lambda: g["forward"](torch.tensor(ids), torch.arange(len(ids)), kv))


def time_hf(model, tok, prompts: list[str], steps: int) -> tuple[float, float]:
    """HF generate：prefill = 生成 1 个的时间；decode 每步 = (生成 steps+1 个 - 生成 1 个) / steps。"""
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)

    def run(n: int) -> float:
        return _timed(lambda: model.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False))

    with torch.inference_mode():
        one = run(1)
        return one, (run(steps + 1) - one) / steps


def load_skeleton(path: str) -> dict:
    """第 0 步：runpy 跑一遍 skeleton.py 的 main（生成 1 个 token，顺带加载权重），拿到它的 forward。"""
    argv, sys.argv = sys.argv, ["skeleton.py", "--model", path, "--max-new-tokens", "1", "--json"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return runpy.run_path(str(ROOT / "step0_skeleton" / "skeleton.py"), run_name="__main__")
    finally:
        sys.argv = argv


def time_skeleton(g: dict, ids: torch.Tensor, steps: int) -> tuple[float, float]:
    """直接调骨架的 forward，和它自己的生成循环一样。"""
    kv = [None] * g["cfg"]["num_hidden_layers"]
    with torch.inference_mode():
        t0 = time.perf_counter()
        logits = g["forward"](ids, torch.arange(len(ids)), kv)
        t1 = time.perf_counter()
        pos = torch.tensor([len(ids)])
        for _ in range(steps):
            logits = g["forward"](logits.argmax()[None], pos, kv)
            pos = pos + 1
    return t1 - t0, (time.perf_counter() - t1) / steps
