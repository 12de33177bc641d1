"""第 6 章的生成入口：模型、KV 池、page table、注意力后端和采样器都由 Engine 按顺序建好；这里只剩调度器的活。

    python generate.py --model DIR --prompt TEXT [--prompt TEXT ...] --max-new-tokens N [--page-size P] [--json]
                       [--tp N]

每一步就是阶段二调度器的那几行：prepare_batch（补齐、分页、positions、out_loc、input_ids、元数据）→
engine.forward_batch → process_output（新 token 写回 token pool 和请求）。默认贪心；--temperature/--top-k/--top-p
按请求采样。--tp N 起 N 个进程，每个一个 Engine、一个 rank，一起跑同一个模型；打印的是 rank 0 的结果。
命令行在 minisgl/server/args.py，起进程在 minisgl/server/launch.py（都和官方的位置一样）。
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.multiprocessing as mp
from safetensors.torch import save_file

from minisgl.core import Req, SamplingParams
from minisgl.engine import Engine, EngineConfig
from minisgl.scheduler import CacheManager, TableManager, add_req, prepare_batch, process_output
from minisgl.server import engine_config, launch_tp, parse_args
from minisgl.utils import load_tokenizer


def step(engine: Engine, table: TableManager, cache: CacheManager, reqs: list[Req], phase: str
         ) -> tuple[list[int], torch.Tensor]:
    """阶段二调度器的一步，手工做：填 batch → 前向 + 采样 → 新 token 写回。返回这一步的 token 和 logits。"""
    batch = prepare_batch(engine, table, cache, reqs, phase)
    out = engine.forward_batch(batch, engine.sampler.prepare(batch))
    return process_output(table, cache, reqs, out), out.logits


def generate(engine: Engine, prompt_ids: list[list[int]], params: SamplingParams, keep_logits: bool = False
             ) -> tuple[list[list[int]], list[torch.Tensor]]:
    """所有请求一起 prefill，再一起 decode；每个请求正好 params.max_tokens 个 token。
    keep_logits 时另返回每一步的 logits（--dump-logits 用）；不要就不留：每步 (bs, V) 个 float 攒下来很大。"""
    table = TableManager(engine.config.max_running_req, engine.page_table)
    cache = CacheManager(engine.num_pages, engine.config.page_size, engine.page_table)
    reqs = [add_req(engine, table, ids, params, uid) for uid, ids in enumerate(prompt_ids)]
    outs, logits = [[] for _ in reqs], []
    for phase in ["prefill"] + ["decode"] * (params.max_tokens - 1):
        tokens, step_logits = step(engine, table, cache, reqs, phase)
        for out, t in zip(outs, tokens):
            out.append(t)
        if keep_logits:  # 要复制：用 CUDA 图时这份 logits 在图的静态缓冲里，下一步就被覆盖
            logits.append(step_logits.clone())
    return outs, logits


def run_rank(config: EngineConfig, prompt_ids: list[list[int]], params: SamplingParams, args: argparse.Namespace
             ) -> tuple[list[list[int]], float]:
    """一个 rank 的全部工作：建 Engine、生成、shutdown。--dump-logits 只由 rank 0 写。"""
    engine = Engine(config)
    try:
        torch.manual_seed(args.seed)  # 每个 rank 同一个种子、同一份（all-gather 后的）logits：采出同样的 token
        with torch.inference_mode():
            t0 = time.perf_counter()
            outs, logits = generate(engine, prompt_ids, params, keep_logits=bool(args.dump_logits))
            seconds = time.perf_counter() - t0
    finally:
        engine.shutdown()
    if args.dump_logits and config.tp_info.is_primary():
        save_file({f"p{i}": torch.stack([lg[i].float().cpu() for lg in logits]) for i in range(len(outs))},
                  args.dump_logits)
    return outs, seconds


def main(argv: list[str] | None = None) -> None:
    """命令行入口（契约见"怎么跑测试"）：不带 --json 时每个提示词一行 repr(提示词) -> repr(生成的文本)，
    最后一行是 tokens/s；
    --json 时最后一行是 {"outputs": [[token id, ...], ...]}（按提示词顺序）；--dump-logits FILE 把每个提示词每一步的
    logits 存成 safetensors，键 p0、p1 …，形状 (生成的 token 数, vocab)。用错的参数：stderr 一行 错误：…，非 0 退出。"""
    args = parse_args(argv, __doc__)
    try:
        tok = load_tokenizer(args.model)  # 缺分词器文件时说出目录和文件名
        prompt_ids = [tok(p).input_ids for p in args.prompt]
        config = engine_config(args, prompt_ids)
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                max_tokens=args.max_new_tokens)
        if args.tp == 1:
            outs, seconds = run_rank(config, prompt_ids, params, args)
        else:
            config.check_tp()  # 起进程之前就拒绝切不开的 --tp
            results = launch_tp(config, run_rank, prompt_ids, params, args)
            if any(r[0] != results[0][0] for r in results):  # 各 rank 的 token 应逐个相同，否则 KV 已经各走各的
                raise RuntimeError(f"各 rank 采出的 token 不一致：{[r[0] for r in results]}")
            outs, seconds = results[0]
    except (ValueError, RuntimeError, OSError, ArithmeticError, mp.ProcessExitedException) as e:  # rank 被杀也只说一行
        sys.exit(f"错误：--tp {args.tp}：{e}" if args.tp > 1 else f"错误：{e}")
    if args.json:
        print(json.dumps({"outputs": outs}))
        return
    for p, out in zip(args.prompt, outs):
        print(f"{p!r} -> {tok.decode(out)!r}")
    total = sum(len(o) for o in outs)
    print(f"{total} tokens，{total / seconds:.1f} tokens/s（{len(outs)} 个请求一个 batch，含 prefill，tp={args.tp}）")


if __name__ == "__main__":
    main()
